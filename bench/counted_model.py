"""The project's `tensorrt_llm` model as bench/serving.py loads it: unchanged, plus a generated-token counter.

serving.py copies this file over `tensorrt_llm/1/model.py` of a temporary copy of model_repository/.
"""

import os
import sys

if os.environ.get("BENCH_CODE_DIR"):  # serving.py --code: an older checkout's package, before the installed one
    sys.path.insert(0, os.environ["BENCH_CODE_DIR"])

from trtllm_model.triton.model import TritonPythonModel as _ProductModel  # noqa: E402

sys.path.insert(0, os.environ["BENCH_DIR"])
from counted import count_generated  # noqa: E402


class TritonPythonModel(_ProductModel):
    def initialize(self, args: dict) -> None:
        if os.environ.get("BENCH_SWITCH_INTERVAL"):  # experiments only: the product decides this itself
            sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
        super().initialize(args)
        count_generated(self.executor)
