"""The checks every executor runs on a request before it reaches its engine.

An id outside the vocabulary indexes past a logits row inside the engine (an IndexError on CPU, a device-side
assert that poisons the CUDA context on a GPU): the engine dies and every other request with it. So every
token-valued field, every count the engines hold in 32 bits, and the logits a request may ask for are checked
here, and a request that fails is refused alone (RequestRejected -> INVALID_ARG, naming the input and the range).

Sizes are bounded too: the engines test every stop and bad word at every step of the request, so a word list's
size is paid per token of every stream that carries it (a 3.2 MB list added about 90 ms of Python to every step).
The conventions refuse a list over these bounds from its tensor's shape, before reading or tokenizing it; the
checks here hold for every executor whatever the convention. The logits of requests in flight share one budget
(LogitsBudget), counted at their peak (LOGITS_PEAK_COPIES): a request that would take it past
`max_total_logits_bytes` is refused as a full queue is, to retry.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from ..executor_interface import Executor, GenerationRequest, QueueFull, RequestRejected, Step

INT32_MAX = 2**31 - 1
# TensorRT-LLM takes allotted_time_ms as a timedelta, which ends here.
MAX_ALLOTTED_TIME_MS = timedelta.max // timedelta(milliseconds=1)
FLOAT32_BYTES = 4
# stop_words / bad_words (and the stop strings of the LLM API convention, embedding_bias_words): words in one list,
# tokens in one word, tokens of one list's words together. Generous for real lists (a bad-words list of a thousand
# words of a few tokens each, stop sequences of a sentence), small enough that a list costs a stream little per step.
MAX_WORDS = 1024
MAX_WORD_TOKENS = 64
MAX_WORD_LIST_TOKENS = 4096
# lora_config rows (one per module and layer: 7 modules x 80 layers is 560 for a 70B Llama).
MAX_LORA_ROWS = 16384
# config.pbtxt parameters read here, for every executor.
PARAMETERS = frozenset({"max_logits_bytes", "max_total_logits_bytes"})
# Logits all requests in flight may hold together, by default: four requests at the per-request bound.
DEFAULT_TOTAL_LOGITS_REQUESTS = 4
# What a request's logits take at their peak, in copies of their float32 bytes: the engine's own (the forward's output,
# or the steps' rows merged while a reader is behind) and the response's tensor built from it. The budget counts this:
# four 256 MiB requests under a 1 GiB budget added 2,049 MiB to the model's process when it counted one copy.
LOGITS_PEAK_COPIES = 2


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
        check_word_list_size(name, words)
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
        check_bytes("guided_decoding_guide", len((request.guided_decoding_guide or "").encode()), MAX_GUIDE_BYTES)
        try:
            json.loads(request.guided_decoding_guide or "")
        except ValueError as exc:
            raise RequestRejected(f"guided_decoding_guide: not a JSON schema ({exc})") from None


def check_word_list_size(name: str, words: list[list[int]]) -> None:
    """RequestRejected when a word list is over MAX_WORDS, MAX_WORD_TOKENS or MAX_WORD_LIST_TOKENS."""
    if len(words) > MAX_WORDS:
        raise RequestRejected(f"{name}: {len(words)} words; at most {MAX_WORDS} per list")
    longest = max((len(word) for word in words), default=0)
    if longest > MAX_WORD_TOKENS:
        raise RequestRejected(f"{name}: a word of {longest} tokens; at most {MAX_WORD_TOKENS} tokens per word")
    total = sum(len(word) for word in words)
    if total > MAX_WORD_LIST_TOKENS:
        raise RequestRejected(f"{name}: {total} tokens in all; at most {MAX_WORD_LIST_TOKENS} per list")


# Text inputs read whole but never tokenized (guides, salts, names, paths): a bound well above real use.
MAX_GUIDE_BYTES = 2**20
MAX_NAME_BYTES = 4096


def check_bytes(name: str, size: int, limit: int) -> None:
    """RequestRejected naming `name` and `limit` when `size` bytes is over it."""
    if size > limit:
        raise RequestRejected(f"{name}: {size} bytes; at most {limit}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ids(name: str, ids: list[int], limit: int, vocab: str) -> None:
    for token in ids:
        if not (_is_int(token) and 0 <= token < limit):
            raise RequestRejected(f"{name}: token id {token} is outside the vocabulary {vocab}")


def _check_bias(bias: list[float] | None, vocab_size: int | None) -> None:
    if bias is None:
        return
    if vocab_size is None and len(bias) > MAX_BIAS_VALUES:
        raise RequestRejected(f"embedding_bias: {len(bias)} values; at most {MAX_BIAS_VALUES} (one per token id)")
    if vocab_size is not None and len(bias) != vocab_size:
        raise RequestRejected(f"embedding_bias: {len(bias)} values; the vocab size is {vocab_size}")
    for index, value in enumerate(bias):
        # -inf bans a token; NaN or +inf would make the whole row NaN or infinite.
        if math.isnan(value) or value == math.inf:
            raise RequestRejected(f"embedding_bias: value {value} at index {index}; expected a finite number or -inf")


# embedding_bias values when the engine's vocab size is unknown: above any vocabulary served today (256k).
MAX_BIAS_VALUES = 2**20


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
    if len(config) > MAX_LORA_ROWS:
        raise RequestRejected(f"lora_config: {len(config)} rows; at most {MAX_LORA_ROWS}")
    if len(weights) != len(config):
        raise RequestRejected(f"lora_weights and lora_config: {len(weights)} weight rows but {len(config)} config rows")
    for row in config.tolist():
        module, layer, adapter_size = row
        if module < 0 or layer < 0 or adapter_size < 1 or max(row) > INT32_MAX:
            raise RequestRejected(f"lora_config: row {row} must be [module id >= 0, layer >= 0, adapter size >= 1]")


class LogitsBudgetFull(QueueFull):
    """The requests in flight hold the logits budget: UNAVAILABLE, to retry (a full queue's code and prefix, which
    the OpenAI frontend answers 429)."""

    def __init__(self, message: str) -> None:
        RuntimeError.__init__(self, f"queue full: {message}")


@dataclass(slots=True)
class _Reservation:
    size: int
    request_id: int | None = None


class LogitsBudget:
    """Bytes of logits the requests in flight may hold together (config.pbtxt `max_total_logits_bytes`): an engine
    keeps a request's logits until its final step, so the per-request bound alone lets a few requests take the
    host's memory. Bytes are reserved before the engine sees a request and released at its final step."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # request id -> bytes
        self._held_bytes = 0
        self._reserving: list[_Reservation] = []
        self._ended: set[int] = set()  # final steps seen while requests were being enqueued

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held_bytes + sum(r.size for r in self._reserving)

    @contextmanager
    def reserve(self, size: int) -> Iterator[_Reservation]:
        """Hold `size` bytes while the caller enqueues; set `.request_id` on what this yields once the engine took
        the request, and the bytes stay held until its final step (else they are freed on leaving)."""
        reservation = _Reservation(size)
        if size == 0:
            yield reservation
            return
        if size > self.limit:
            raise RequestRejected(f"return_context_logits / return_generation_logits: {size} bytes of logits at their "
                                  f"peak is over max_total_logits_bytes={self.limit}, the model's total for all requests")
        with self._lock:
            held = self._held_bytes + sum(r.size for r in self._reserving)
            if held + size > self.limit:
                raise LogitsBudgetFull(
                    f"logits budget spent: this request's {size} bytes of logits at their peak and the {held} held by "
                    f"requests in flight are over max_total_logits_bytes={self.limit}; retry when some have ended")
            self._reserving.append(reservation)
        try:
            yield reservation
        finally:
            with self._lock:
                self._reserving.remove(reservation)
                request_id = reservation.request_id
                if request_id is not None and request_id not in self._ended:
                    self._held[request_id] = size
                    self._held_bytes += size
                self._ended.discard(request_id)
                if not self._reserving:
                    self._ended.clear()

    def release(self, steps: list[Step]) -> None:
        """Free the bytes of the requests whose final step is among `steps`."""
        with self._lock:
            for step in steps:
                if not step.is_final:
                    continue
                size = self._held.pop(step.request_id, None)
                if size is not None:
                    self._held_bytes -= size
                elif self._reserving:  # it may end before its enqueue returned the id
                    self._ended.add(step.request_id)


def bound_logits_in_flight(executor: Executor, budget: LogitsBudget) -> None:
    """Route `executor`'s enqueue and await_steps through `budget` (each executor's own checks run inside)."""
    enqueue, await_steps = executor.enqueue, executor.await_steps

    def budgeted_enqueue(request: GenerationRequest) -> int:
        vocab_size = executor.vocab_size
        if vocab_size is None:
            return enqueue(request)
        _check_logits(request, vocab_size, executor.max_logits_bytes)  # over its own bound: refused as such
        with budget.reserve(LOGITS_PEAK_COPIES * logits_bytes(request, vocab_size)) as reservation:
            reservation.request_id = enqueue(request)
            return reservation.request_id

    def budgeted_await_steps(timeout_s: float) -> list[Step]:
        steps = await_steps(timeout_s)
        budget.release(steps)
        return steps

    executor.logits_budget = budget
    executor.enqueue = budgeted_enqueue
    executor.await_steps = budgeted_await_steps
