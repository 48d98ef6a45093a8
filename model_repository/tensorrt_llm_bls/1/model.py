# Thin entry point: NVIDIA's `tensorrt_llm_bls` model; the code lives in the trtllm_model package.
from trtllm_model.triton.bls_model import TritonPythonModel  # noqa: F401
