"""NVIDIA's `preprocessing` model: text, word lists and ids in NVIDIA's upper-case names -> the token tensors that
`tensorrt_llm` takes. One response per request (not decoupled), as NVIDIA's.

`ensemble` does not use it (it tokenizes inside `tensorrt_llm`, no extra hop); clients that chain the three models
themselves (NVIDIA's end_to_end_test.py) do. Parameters: `tokenizer_dir` (unset: the tokenizer of this repository's
`tensorrt_llm`), `add_special_tokens` (default true).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from ..params import ConfigError, Params, parameters_from_model_config
from ..serving.request_context import ErrorCode
from . import text_pipeline
from .triton_io import request_tensors, triton_error

PARAMETERS = ("tokenizer_dir", "add_special_tokens", "multimodal_model_path", "gpt_model_path", "max_num_images")
# Vision inputs of NVIDIA's multimodal preprocessing: declared so their clients get a clear answer.
VISION_INPUTS = ("IMAGE_BYTES", "IMAGE_URL", "VIDEO_BYTES")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        raw = parameters_from_model_config(json.loads(args["model_config"]))
        params = Params(raw, accepted=PARAMETERS)
        if params.str("multimodal_model_path"):
            raise ConfigError("parameter multimodal_model_path: multimodal models are not served here")
        self.add_special_tokens = params.bool("add_special_tokens", True)
        repository = Path(args["model_repository"]).parent
        self.tokenizer = text_pipeline.repository_tokenizer({"tokenizer_dir": raw.get("tokenizer_dir", "")}, repository)
        self.end_id, self.pad_id = text_pipeline.end_and_pad_ids(self.tokenizer)
        self.prompt_limits = text_pipeline.repository_limits(repository)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                outputs = self._outputs(request_tensors(request))
                tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except text_pipeline.BadInput as exc:
                code = ErrorCode.UNSUPPORTED if exc.unsupported else ErrorCode.INVALID_ARG
                responses.append(pb_utils.InferenceResponse(error=triton_error(code, str(exc))))
        return responses

    def _outputs(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name in VISION_INPUTS:
            if name in tensors:
                raise text_pipeline.BadInput(f"{name}: multimodal input is not served here", unsupported=True)
        for name in ("QUERY", "REQUEST_OUTPUT_LEN"):
            if name not in tensors:
                raise text_pipeline.BadInput(f"{name}: required")
        queries = text_pipeline.texts("QUERY", tensors["QUERY"])
        batch = len(queries)
        end_id = tensors.get("END_ID", np.full((batch, 1), self.end_id, np.int32)).astype(np.int32).reshape(batch, 1)
        pad_id = tensors.get("PAD_ID", np.full((batch, 1), self.pad_id, np.int32)).astype(np.int32).reshape(batch, 1)
        input_ids, input_lengths = text_pipeline.encode_batch(self.tokenizer, queries, self.add_special_tokens, self.pad_id,
                                                              self.prompt_limits)
        if "DECODER_QUERY" in tensors:
            decoder_queries = text_pipeline.texts("DECODER_QUERY", tensors["DECODER_QUERY"])
            decoder_ids, decoder_lengths = text_pipeline.encode_batch(
                self.tokenizer, decoder_queries, self.add_special_tokens, self.pad_id, self.prompt_limits)
        else:  # as NVIDIA's: one pad token (tensorrt_llm ignores it for a decoder-only engine)
            decoder_ids, decoder_lengths = pad_id.copy(), np.ones((batch, 1), np.int32)
        outputs = {
            "INPUT_ID": input_ids,
            "REQUEST_INPUT_LEN": input_lengths,
            "DECODER_INPUT_ID": decoder_ids,
            "REQUEST_DECODER_INPUT_LEN": decoder_lengths,
            "BAD_WORDS_IDS": text_pipeline.word_lists("BAD_WORDS_DICT", self.tokenizer, tensors.get("BAD_WORDS_DICT"), batch),
            "STOP_WORDS_IDS": text_pipeline.word_lists("STOP_WORDS_DICT", self.tokenizer, tensors.get("STOP_WORDS_DICT"),
                                                       batch),
            "EMBEDDING_BIAS": text_pipeline.embedding_bias(
                self.tokenizer, tensors.get("EMBEDDING_BIAS_WORDS"), tensors.get("EMBEDDING_BIAS_WEIGHTS"), batch),
            "REQUEST_OUTPUT_LEN": tensors["REQUEST_OUTPUT_LEN"].astype(np.int32),
            "OUT_END_ID": end_id,
            "OUT_PAD_ID": pad_id,
        }
        if "PROMPT_TABLE_EXTRA_ID" in tensors:
            # Prompt-table tokens (ids past the vocabulary) carry the request's extra id, the others 0.
            extra = tensors["PROMPT_TABLE_EXTRA_ID"].astype(np.uint64).reshape(batch, 1)
            vocab = len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else np.iinfo(np.int32).max
            outputs["OUT_PROMPT_TABLE_EXTRA_IDS"] = np.where(input_ids >= vocab, extra, 0).astype(np.uint64)
        return outputs

    def finalize(self) -> None:
        pass
