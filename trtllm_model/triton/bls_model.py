"""NVIDIA's `tensorrt_llm_bls` model: the ensemble's text-level names, forwarded to `tensorrt_llm` through BLS
(bls_forwarding; tokenization and incremental detokenization inside `tensorrt_llm`).

Parameters (NVIDIA's): `tensorrt_llm_model_name` (default tensorrt_llm), `accumulate_tokens` (true: each streamed
`text_output` holds the whole text so far, not the new part; as NVIDIA's, for one prompt and one sequence per
request), `tensorrt_llm_draft_model_name` and `multimodal_encoders_name` (must stay empty: speculative decoding
with a draft model and multimodal encoders are not served here).
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from ..params import ConfigError, Params, parameters_from_model_config
from . import bls_forwarding

PARAMETERS = ("accumulate_tokens", "tensorrt_llm_model_name", "tensorrt_llm_draft_model_name", "multimodal_encoders_name")


class TritonPythonModel(bls_forwarding.ForwardingModel):
    def initialize(self, args: dict) -> None:
        params = Params(parameters_from_model_config(json.loads(args["model_config"])), accepted=PARAMETERS)
        for name in ("tensorrt_llm_draft_model_name", "multimodal_encoders_name"):
            if params.str(name):
                raise ConfigError(f"parameter {name}={params.str(name)!r}: not served here; leave it empty")
        self.target = params.str("tensorrt_llm_model_name", bls_forwarding.TARGET_MODEL)
        self.accumulate_tokens = params.bool("accumulate_tokens", False)
        super().initialize(args)

    def _stream_state(self, inputs: list, sequences: int) -> list[str] | None:
        if not self.accumulate_tokens:
            return None
        returns = next((t.as_numpy() for t in inputs if t.name() == "num_return_sequences"), None)
        if sequences != 1 or (returns is not None and int(returns.max(initial=1)) > 1):
            raise bls_forwarding.Refused("accumulate_tokens: needs one prompt and one sequence per request")
        return []  # the text sent so far

    def _outgoing(self, tensors: list, state: list[str] | None) -> list:
        if state is None:
            return tensors
        out = []
        for tensor in tensors:
            if tensor.name() == "text_output":
                delta = tensor.as_numpy()
                state.append(b"".join(_as_bytes(v) for v in delta.reshape(-1)).decode("utf-8"))
                whole = np.array(["".join(state).encode("utf-8")], dtype=np.object_).reshape(delta.shape or (1,))
                tensor = pb_utils.Tensor("text_output", whole)
            out.append(tensor)
        return out


def _as_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")
