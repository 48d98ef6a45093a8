# Thin entry point: NVIDIA's `preprocessing` model; the code lives in the trtllm_model package.
from trtllm_model.triton.preprocessing_model import TritonPythonModel  # noqa: F401
