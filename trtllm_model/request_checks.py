"""The checks every executor runs on a request before it reaches its engine.

An id outside the vocabulary indexes past a logits row inside the engine (an IndexError on CPU, a device-side
assert that poisons the CUDA context on a GPU): the engine dies and every other request with it. So every
token-valued field, every count the engines hold in 32 bits, and the logits a request may ask for are checked
here, and a request that fails is refused alone (RequestRejected -> INVALID_ARG, naming the input and the range).
"""

from __future__ import annotations

import json
import math
from datetime import timedelta

from .executor_interface import GenerationRequest, RequestRejected

INT32_MAX = 2**31 - 1
# TensorRT-LLM takes allotted_time_ms as a timedelta, which ends here.
MAX_ALLOTTED_TIME_MS = timedelta.max // timedelta(milliseconds=1)
FLOAT32_BYTES = 4
# config.pbtxt parameters read here, for every executor.
PARAMETERS = frozenset({"max_logits_bytes"})


def check_request(request: GenerationRequest, vocab_size: int | None, max_logits_bytes: int | None) -> None:
    """RequestRejected for the first field an engine with `vocab_size` tokens (None: unknown) cannot take."""
    vocab = f"[0, {vocab_size})" if vocab_size is not None else f"[0, {INT32_MAX}]"
    limit = vocab_size if vocab_size is not None else INT32_MAX + 1
    _check_ids("input_ids", request.input_ids, limit, vocab)
    if request.end_id is not None and not (_is_int(request.end_id) and -1 <= request.end_id < limit):
        raise RequestRejected(f"end_id={request.end_id}: must be within {vocab}, or -1 for no end token")
    if request.pad_id is not None and not (_is_int(request.pad_id) and 0 <= request.pad_id < limit):
        raise RequestRejected(f"pad_id={request.pad_id}: must be within {vocab}")
    for name, words in (("stop_words", request.stop_words), ("bad_words", request.bad_words)):
        for word in words:
            _check_ids(name, word, limit, vocab)
    _check_bias(request.embedding_bias, vocab_size)
    for name, value, low in (
        ("request_output_len (max_tokens)", request.max_tokens, 1),
        ("min_tokens", request.min_tokens, 0),
        ("top_k", request.top_k, 0),
        ("beam_width", request.beam_width, 1),
        ("num_return_sequences", request.num_return_sequences, 1),
    ):
        if value is not None and not (_is_int(value) and low <= value <= INT32_MAX):
            raise RequestRejected(f"{name}: {value} is outside [{low}, {INT32_MAX}]")
    if request.allotted_time_ms is not None and not 0 < request.allotted_time_ms <= MAX_ALLOTTED_TIME_MS:
        raise RequestRejected(f"allotted_time_ms={request.allotted_time_ms}: must be within [1, {MAX_ALLOTTED_TIME_MS}]")
    _check_logits(request, vocab_size, max_logits_bytes)
    _check_lora(request)
    if request.guided_decoding_type == "json_schema":
        try:
            json.loads(request.guided_decoding_guide or "")
        except ValueError as exc:
            raise RequestRejected(f"guided_decoding_guide: not a JSON schema ({exc})") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ids(name: str, ids: list[int], limit: int, vocab: str) -> None:
    for token in ids:
        if not (_is_int(token) and 0 <= token < limit):
            raise RequestRejected(f"{name}: token id {token} is outside the vocabulary {vocab}")


def _check_bias(bias: list[float] | None, vocab_size: int | None) -> None:
    if bias is None:
        return
    if vocab_size is not None and len(bias) != vocab_size:
        raise RequestRejected(f"embedding_bias: {len(bias)} values; the vocab size is {vocab_size}")
    for index, value in enumerate(bias):
        # -inf bans a token; NaN or +inf would make the whole row NaN or infinite.
        if math.isnan(value) or value == math.inf:
            raise RequestRejected(f"embedding_bias: value {value} at index {index}; expected a finite number or -inf")


def logits_bytes(request: GenerationRequest, vocab_size: int) -> int:
    """float32 bytes of the logits a request asks for: context [prompt, vocab], generation [beams, tokens, vocab]."""
    tokens = 0
    if request.return_context_logits:
        tokens += len(request.input_ids)
    if request.return_generation_logits:
        tokens += request.max_tokens * max(request.beam_width, 1) * max(request.num_return_sequences, 1)
    return tokens * vocab_size * FLOAT32_BYTES


def _check_logits(request: GenerationRequest, vocab_size: int | None, max_logits_bytes: int | None) -> None:
    if max_logits_bytes is None or vocab_size is None:
        return
    size = logits_bytes(request, vocab_size)
    if size > max_logits_bytes:
        asked = [name for name, on in (("return_context_logits", request.return_context_logits),
                                      ("return_generation_logits", request.return_generation_logits)) if on]
        raise RequestRejected(
            f"{' and '.join(asked)}: {size} bytes of float32 logits (tokens x vocab size {vocab_size} x 4) is over "
            f"max_logits_bytes={max_logits_bytes}; ask for fewer tokens (request_output_len, the prompt) or raise "
            "the model's max_logits_bytes parameter"
        )


def _check_lora(request: GenerationRequest) -> None:
    """NVIDIA's lora_config rows are [module id, layer, adapter size], one per lora_weights row."""
    weights, config = request.lora_weights, request.lora_config
    if weights is None or config is None:
        return
    if getattr(weights, "dtype", None) is None or weights.dtype.kind != "f":
        raise RequestRejected(f"lora_weights: expected FP16 or FP32 weights, got {getattr(weights, 'dtype', None)}")
    if len(weights) != len(config):
        raise RequestRejected(f"lora_weights and lora_config: {len(weights)} weight rows but {len(config)} config rows")
    for row in config.tolist():
        module, layer, adapter_size = row
        if module < 0 or layer < 0 or adapter_size < 1 or max(row) > INT32_MAX:
            raise RequestRejected(f"lora_config: row {row} must be [module id >= 0, layer >= 0, adapter size >= 1]")
