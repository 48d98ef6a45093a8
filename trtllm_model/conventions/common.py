"""What every tensor convention shares: the parsed request, the model's limits, one response's content, and the
refusal a parser raises. Pure numpy; no Triton here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..executor_interface import GenerationRequest

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
    # Executor name, for error messages.
    executor_name: str = "this"


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
