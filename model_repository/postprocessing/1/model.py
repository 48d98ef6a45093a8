# Thin entry point: NVIDIA's `postprocessing` model; the code lives in the trtllm_model package.
from trtllm_model.triton.postprocessing_model import TritonPythonModel  # noqa: F401
