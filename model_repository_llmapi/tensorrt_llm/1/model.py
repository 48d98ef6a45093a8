# Thin entry point: Triton loads this file; the model lives in the trtllm_model package.
from trtllm_model.triton.model import TritonPythonModel  # noqa: F401
