# Thin entry point: NVIDIA's text-level `ensemble` names, forwarded to the `tensorrt_llm` model.
from trtllm_model.ensemble_model import TritonPythonModel  # noqa: F401
