"""A strict CPU fake of `tensorrt_llm` for tests: the executor binding and the LLM API (see each module).

FAKE_TRTLLM_GPU=0 makes the import fail the way the real package does on a machine without the NVIDIA driver.
"""

import os

if os.environ.get("FAKE_TRTLLM_GPU", "1") == "0":
    raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")

from .llmapi import LLM, SamplingParams

__version__ = "1.2.0+fake"
__all__ = ["LLM", "SamplingParams", "__version__"]
