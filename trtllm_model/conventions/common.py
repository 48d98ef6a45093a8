"""What every tensor convention shares: the parsed request, the model's limits, one response's content, and the
refusal a parser raises. Pure numpy; no Triton here."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..executor_interface import GenerationRequest, Tokenizer
from ..pipeline.request_checks import MAX_WORD_LIST_TOKENS, MAX_WORD_TOKENS, MAX_WORDS

UINT64_MAX = 2**64 - 1


class InvalidInput(ValueError):
    """A request the model refuses; `unsupported` selects UNSUPPORTED over INVALID_ARG."""

    def __init__(self, message: str, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


@dataclass(frozen=True, slots=True)
class Limits:
    """Model-wide limits and defaults from config.pbtxt."""

    max_input_len: int | None = None
    max_output_len: int | None = None
    max_seq_len: int | None = None  # prompt + max tokens (the engine's build limit)
    max_beam_width: int | None = None
    vocab_size: int | None = None
    exclude_input_in_output: bool = False
    apply_chat_template: bool = False
    # Request parameters (besides Triton's own `triton_*`) this model accepts, e.g. synthetic fault injection.
    accepted_parameters: frozenset[str] = frozenset()
    # Optional inputs the executor honours (executor_interface.OPTIONAL_INPUTS keys); others are UNSUPPORTED.
    optional_inputs: frozenset[str] = frozenset()
    # `decoupled: false` in config.pbtxt: exactly one response per request, so streaming is refused.
    decoupled: bool = True
    # Executor name, for error messages ("" where the caller did not say).
    executor_name: str = ""

    @property
    def executor_label(self) -> str:
        """How an error message names the executor: "the transformers executor", or "this executor"."""
        return f"the {self.executor_name} executor" if self.executor_name else "this executor"


@dataclass(slots=True)
class ParsedRequest:
    """What `execute()` learned from one Triton request."""

    generation: GenerationRequest
    text_mode: bool
    return_log_probs: bool = False
    return_finish_reason: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    return_perf_metrics: bool = False
    # `stop` input: this request only asks to cancel the in-flight request with the same request id.
    stop_only: bool = False
    prompt_ids: list[int] = field(default_factory=list)
    # Set by the request's convention (conventions/): its output tensors (default: inflight_batcher.response_outputs), and
    # for a `stop` request, the message of the CANCELLED error that answers it (None: an empty response).
    outputs: Callable[[ParsedRequest, ResponseContent], dict[str, np.ndarray]] | None = None
    stop_error: str | None = None


@dataclass(slots=True)
class ResponseContent:
    """What one response carries, before it becomes tensors. One beam unless beam_width > 1."""

    beams: list[list[int]]
    texts: list[str] | None = None  # one per beam (text requests)
    log_probs: list[list[float]] | None = None  # one list per beam
    cum_log_probs: list[float] | None = None  # one per beam
    top_log_probs: list[list[tuple[int, float]]] | None = None  # per token (one beam): the likeliest (id, log prob)
    finish_reason: str | None = None
    num_output_tokens: int = 0
    sequence_index: int = 0
    context_logits: np.ndarray | None = None  # [prompt tokens, vocab]
    generation_logits: np.ndarray | None = None  # [beams, tokens, vocab]
    perf: dict[str, float] | None = None  # PERF_OUTPUTS name -> value


# `return_perf_metrics` outputs, with NVIDIA's dtypes; each is [1, 1].
PERF_OUTPUTS = {
    "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32, "kv_cache_alloc_total_blocks": np.int32,
    "arrival_time_ns": np.int64, "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64, "acceptance_rate": np.float32, "total_accepted_draft_tokens": np.int32,
    "total_draft_tokens": np.int32,
}


def utf8(name: str, item) -> str:
    """One BYTES element as text; not UTF-8 is the client's error, naming the input."""
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{name}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def in_range(name: str, value: int, minimum: int | None, maximum: int | None) -> int:
    """`value`, or InvalidInput naming the input when it lies outside [minimum, maximum]."""
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{name}={value}: must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidInput(f"{name}={value}: must be at most {maximum}")
    return value


# Bytes one token may stand for when a tokenizer cannot list its vocabulary: one UTF-8 character.
MIN_TOKEN_BYTES = 4
# Prompt tokens when neither max_input_len nor max_seq_len bounds them (no engine served here has more positions).
UNBOUNDED_PROMPT_TOKENS = 2**20
_LONGEST_TOKEN_BYTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def longest_token_bytes(tokenizer: Tokenizer) -> int:
    """UTF-8 bytes of the tokenizer's longest vocabulary entry (computed once per tokenizer: ~50 ms for 49k entries).

    An entry's text is at least as long as the text its token stands for (byte-level BPE writes each byte as one
    character of 1-2 bytes, SentencePiece a space as the 3-byte '▁', byte-fallback tokens as '<0xNN>'), so a text
    longer than max_input_len times this cannot tokenize within max_input_len: refusing it before tokenizing
    refuses nothing that fits (tokenizers whose normalizer drops characters aside)."""
    try:
        return _LONGEST_TOKEN_BYTES[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = getattr(tokenizer, "get_vocab", None)
    longest = max((len(entry.encode()) for entry in vocab()), default=0) if vocab is not None else 0
    longest = max(longest, MIN_TOKEN_BYTES)
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed again next time
        _LONGEST_TOKEN_BYTES[tokenizer] = longest
    return longest


def element_bytes(item) -> int:
    """Size of one BYTES element without decoding it."""
    return len(item) if isinstance(item, (bytes, bytearray, memoryview)) else len(str(item).encode())


def check_prompt_size(name: str, item, limits: Limits, tokenizer: Tokenizer) -> None:
    """InvalidInput before tokenizing a prompt too long in bytes to fit max_input_len tokens (see longest_token_bytes)."""
    bound = next((f"{key}={value}" for key, value in (("max_input_len", limits.max_input_len),
                                                      ("max_seq_len", limits.max_seq_len)) if value), None)
    tokens = limits.max_input_len or limits.max_seq_len or UNBOUNDED_PROMPT_TOKENS
    per_token = longest_token_bytes(tokenizer)
    size = element_bytes(item)
    if size > tokens * per_token:
        raise InvalidInput(f"{name}: {size} bytes cannot fit {bound or tokens} tokens: at most {tokens * per_token} "
                           f"bytes ({tokens} x {per_token}, the tokenizer's longest token in bytes)")


def check_request_prompts_size(name: str, prompts: np.ndarray, limits: Limits, tokenizer: Tokenizer) -> None:
    """InvalidInput, before any row is parsed or tokenized, for a batched request whose prompts together are longer in
    bytes than one prompt may be (`check_prompt_size`'s bound): a request's tokenizing costs the model's intake, which
    every other request waits for, at most what one prompt's does."""
    if prompts.size <= 1:
        return
    tokens = limits.max_input_len or limits.max_seq_len or UNBOUNDED_PROMPT_TOKENS
    per_token = longest_token_bytes(tokenizer)
    size = sum(element_bytes(item) for item in prompts.flat)
    if size > tokens * per_token:
        raise InvalidInput(f"{name}: {size} bytes in {prompts.size} prompts; a request's prompts together at most "
                           f"{tokens * per_token} bytes (what one prompt of {tokens} tokens may take): send fewer or "
                           "shorter prompts a request")


def check_word_texts(name: str, items: list, tokenizer: Tokenizer) -> None:
    """InvalidInput, before tokenizing, for a list of words (text) over request_checks' word bounds: more than
    MAX_WORDS words, a word longer in bytes than MAX_WORD_TOKENS tokens can be, or all longer than
    MAX_WORD_LIST_TOKENS tokens can be."""
    if len(items) > MAX_WORDS:
        raise InvalidInput(f"{name}: {len(items)} words; at most {MAX_WORDS} per list")
    per_token = longest_token_bytes(tokenizer)
    sizes = [element_bytes(item) for item in items]
    if max(sizes, default=0) > MAX_WORD_TOKENS * per_token:
        raise InvalidInput(f"{name}: a word of {max(sizes)} bytes; at most {MAX_WORD_TOKENS * per_token} "
                           f"({MAX_WORD_TOKENS} tokens of at most {per_token} bytes)")
    if sum(sizes) > MAX_WORD_LIST_TOKENS * per_token:
        raise InvalidInput(f"{name}: {sum(sizes)} bytes in all; at most {MAX_WORD_LIST_TOKENS * per_token} "
                           f"({MAX_WORD_LIST_TOKENS} tokens of at most {per_token} bytes)")
