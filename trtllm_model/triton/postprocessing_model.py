"""NVIDIA's `postprocessing` model: TOKENS_BATCH [batch, beams, tokens] and SEQUENCE_LENGTH [batch, beams] ->
OUTPUT text [batch, beams]. One response per request (not decoupled), as NVIDIA's.

Each call decodes what it is given as a whole: a client that sends each streamed delta on its own gets NVIDIA's
known artefacts (split multi-byte characters, lost word-boundary spaces); `ensemble` and `tensorrt_llm_bls` stream
text detokenized incrementally inside `tensorrt_llm` instead. Parameters: `tokenizer_dir` (unset: the tokenizer of
this repository's `tensorrt_llm`), `skip_special_tokens` (default true).
"""

from __future__ import annotations

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from ..params import Params, parameters_from_model_config
from ..serving.request_context import ErrorCode
from . import text_pipeline
from .triton_io import request_tensors, triton_error


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        raw = parameters_from_model_config(json.loads(args["model_config"]))
        params = Params(raw, accepted=("tokenizer_dir", "skip_special_tokens"))
        self.skip_special_tokens = params.bool("skip_special_tokens", True)
        repository = Path(args["model_repository"]).parent
        self.tokenizer = text_pipeline.repository_tokenizer({"tokenizer_dir": raw.get("tokenizer_dir", "")}, repository)
        self.limits = text_pipeline.repository_limits(repository)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            tensors = request_tensors(request)
            try:
                if "TOKENS_BATCH" not in tensors or "SEQUENCE_LENGTH" not in tensors:
                    raise text_pipeline.BadInput("TOKENS_BATCH and SEQUENCE_LENGTH: both required")
                text = text_pipeline.decode_batch(
                    self.tokenizer, tensors["TOKENS_BATCH"], tensors["SEQUENCE_LENGTH"], self.skip_special_tokens,
                    self.limits)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", text)]))
            except text_pipeline.BadInput as exc:
                code = ErrorCode.UNSUPPORTED if exc.unsupported else ErrorCode.INVALID_ARG
                responses.append(pb_utils.InferenceResponse(error=triton_error(code, str(exc))))
        return responses

    def finalize(self) -> None:
        pass
