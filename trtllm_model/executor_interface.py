"""The executor interface every engine offers the poller.

It mirrors TensorRT-LLM's executor: `enqueue` returns an id, `await_steps` blocks until any request has new
tokens (or the timeout passes), a step carries only what is new since the previous one, `cancel` takes an id.
Executors never see Triton objects; TensorRT-LLM objects never leave the `trtllm_*` adapters.

The layers import only downward: Triton edge (model.py, triton_io.py) -> poller -> this interface -> engines
(`executors/` adapters, and `embedded/` below the transformers executor). Nothing here imports the package.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol


class FinishReason(enum.Enum):
    """Why a sequence ended; `.value` is what clients see in `finish_reason`."""

    NOT_FINISHED = "not_finished"
    END_ID = "end_id"
    STOP_WORDS = "stop_words"
    LENGTH = "length"
    TIMED_OUT = "timeout"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(slots=True)
class GenerationRequest:
    """One generation request, engine-neutral. `None` means "the engine's default"."""

    input_ids: list[int]
    max_tokens: int
    streaming: bool = True
    end_id: int | None = None
    pad_id: int | None = None
    exclude_input_in_output: bool = True
    # Sampling. temperature None or 0 with no top_k/top_p means greedy.
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    min_tokens: int | None = None
    # Each word may span several tokens.
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    embedding_bias: list[float] | None = None
    return_log_probs: bool = False
    # The likeliest tokens with their log probs at each generated position (0: none; at most MAX_TOP_LOG_PROBS).
    num_top_log_probs: int = 0
    beam_width: int = 1
    num_return_sequences: int = 1
    # A request past this many milliseconds ends with the tokens so far and FinishReason.TIMED_OUT.
    allotted_time_ms: int | None = None
    # Optional NVIDIA inputs; the edge refuses those the executor does not honour (Executor.optional_inputs).
    return_context_logits: bool = False
    return_generation_logits: bool = False
    return_perf_metrics: bool = False
    lora_task_id: int | None = None
    lora_weights: object | None = None  # numpy array [layers x modules, size] as NVIDIA's `lora_weights`
    lora_config: object | None = None  # numpy int32 array [layers x modules, 3] as NVIDIA's `lora_config`
    guided_decoding_type: str | None = None  # json | json_schema | regex | ebnf_grammar
    guided_decoding_guide: str | None = None
    # vLLM's cache_salt: cached KV blocks are shared only among requests of the same salt (None: the unsalted ones).
    cache_salt: str | None = None
    # NVIDIA's LLM API inputs (conventions/llmapi.py): a LoRA adapter by path (lora_id, lora_name, lora_path,
    # lora_ckpt_source) and a logits post-processor declared in model.yaml, by name. Executors without them have
    # no `llmapi_features` for them, and the edge refuses such requests as UNSUPPORTED.
    lora_adapter: tuple[int, str, str, str] | None = None
    logits_post_processor: str | None = None
    # Executor-specific test hooks (the synthetic executor's fault injection); ignored by real engines.
    faults: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Step:
    """What one request gained since its previous step."""

    request_id: int
    token_ids: list[int] = field(default_factory=list)
    is_final: bool = False
    finish_reason: FinishReason = FinishReason.NOT_FINISHED
    log_probs: list[float] | None = None
    cum_log_prob: float | None = None
    # With num_top_log_probs: per token of token_ids, the likeliest tokens as (token id, log prob), best first.
    top_log_probs: list[list[tuple[int, float]]] | None = None
    error: str | None = None
    client_error: bool = False  # `error` is the request's own doing (INVALID_ARG), not the engine's (INTERNAL)
    sequence_index: int = 0
    # beam_width > 1: every beam in full so far (beams may rewrite earlier tokens); token_ids is then unused.
    beams: list[list[int]] | None = None
    # beam_width > 1 with log probs: each beam's log probs in full so far (log_probs is then unused).
    beam_log_probs: list[list[float]] | None = None
    beam_cum_log_probs: list[float] | None = None
    # Requested logits (numpy float32): context [prompt tokens, vocab] once; generation [beams, tokens, vocab] of the
    # tokens this step carries.
    context_logits: object | None = None
    generation_logits: object | None = None
    # KV-cache block counts for `return_perf_metrics`, where the engine counts them.
    kv_cache_alloc_new_blocks: int | None = None
    kv_cache_reused_blocks: int | None = None
    kv_cache_alloc_total_blocks: int | None = None


@dataclass(slots=True)
class KvCacheStats:
    max_blocks: int
    free_blocks: int
    used_blocks: int
    tokens_per_block: int
    # Prefix reuse since start, as TensorRT-LLM's KvCacheStats counts it (None: the engine does not reuse blocks):
    # full prompt blocks found cached, those looked up and not found, and reused / (reused + missed).
    reused_blocks: int | None = None
    missed_blocks: int | None = None
    cache_hit_rate: float | None = None


@dataclass(slots=True)
class IterationStats:
    """One engine iteration. A field left None is one this executor does not truly have."""

    timestamp: float
    iteration: int
    active_requests: int
    queued_requests: int
    max_active_requests: int
    scheduled_requests: int | None = None
    context_requests: int | None = None
    generation_requests: int | None = None
    context_tokens: int | None = None
    paused_requests: int | None = None
    micro_batch_id: int | None = None
    tokens_in_step: int | None = None
    cpu_mem_bytes: int | None = None
    gpu_mem_bytes: int | None = None
    pinned_mem_bytes: int | None = None
    kv_cache: KvCacheStats | None = None


@dataclass(frozen=True, slots=True)
class BuildLimits:
    """What the engine behind an executor was built (and configured) for; None where it has no fixed limit.

    The model refuses a request past these before enqueue, and a config.pbtxt limit larger than them at load.
    `source` says where they were read, for error messages (e.g. the engine's config.json).
    """

    max_input_len: int | None = None
    max_seq_len: int | None = None  # prompt + generated tokens
    max_beam_width: int | None = None
    max_batch_size: int | None = None
    source: str = "the engine"


# The most float32 logits (context + generation) one request may ask for: config.pbtxt `max_logits_bytes`.
DEFAULT_MAX_LOGITS_BYTES = 256 * 2**20

# Optional inputs an executor may honour, by the NVIDIA input names that ask for them.
OPTIONAL_INPUTS = {
    "return_context_logits": ("return_context_logits",),
    "return_generation_logits": ("return_generation_logits",),
    "lora": ("lora_task_id", "lora_weights", "lora_config"),
    "guided_decoding": ("guided_decoding_guide_type", "guided_decoding_guide"),
    "cache_salt": ("cache_salt",),
    "top_log_probs": ("num_top_log_probs",),
}

# The most alternatives per token `num_top_log_probs` may ask for (OpenAI's top_logprobs bound).
MAX_TOP_LOG_PROBS = 20


class Tokenizer(Protocol):
    """What the text interface needs from a tokenizer (a Hugging Face tokenizer satisfies it)."""

    eos_token_id: int | None
    pad_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(
        self, token_ids: list[int], skip_special_tokens: bool = ..., clean_up_tokenization_spaces: bool = ...
    ) -> str: ...


class ExecutorError(RuntimeError):
    """Raised by an executor that can no longer serve (dead engine, failed step)."""


class QueueFull(RuntimeError):
    """Raised by `enqueue` (or the poller) while `limit` requests already wait: the client may retry (UNAVAILABLE).
    The message carries both phrases NVIDIA's clients match (tritonserver's own queue-full wording, gRPC and HTTP)
    and begins with "queue full", which the OpenAI frontend maps to 429."""

    def __init__(self, held: int, limit: int, what: str) -> None:
        super().__init__(f"queue full: Exceeds maximum queue size; Maximum queue size of {limit} reached "
                         f"({held} {what})")


class RequestRejected(ValueError):
    """Raised by `enqueue` for a request this executor cannot take; the message names the field."""

    def __init__(self, message: str, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


class Executor(ABC):
    """An engine behind the poller. `enqueue`, `cancel` and `await_steps` may be called from different threads."""

    # Token ids at or above this are refused (None: no fixed vocabulary); request_checks.check_request.
    vocab_size: int | None = None
    # A request asking for more logits bytes than this is refused (None: no bound).
    max_logits_bytes: int | None = DEFAULT_MAX_LOGITS_BYTES
    # Limits the engine was built for (all None: the executor checks its own, or has none).
    build_limits: BuildLimits = BuildLimits()
    # Optional NVIDIA inputs this executor honours (see OPTIONAL_INPUTS); the edge refuses the others as
    # UNSUPPORTED, naming the input.
    optional_inputs: frozenset[str] = frozenset()

    @abstractmethod
    def enqueue(self, request: GenerationRequest) -> int:
        """Submit a request; returns its id. Raises RequestRejected for a bad request, ExecutorError if dead."""

    @abstractmethod
    def await_steps(self, timeout_s: float) -> list[Step]:
        """Block until some request has new output or `timeout_s` passes; never spins. Raises ExecutorError."""

    @abstractmethod
    def cancel(self, request_id: int) -> None:
        """Ask the engine to stop a request; it still answers with a final step (CANCELLED)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the engine and release its resources; idempotent."""

    def enqueue_together(self) -> AbstractContextManager[None]:
        """Around a run of `enqueue` calls from one thread (one `execute()` batch): an executor may hand them to its
        engine together when the block ends. By default each goes at once."""
        return nullcontext()

    @property
    def batch_slots(self) -> int | None:
        """Rows the engine runs at once (its max batch size); None where it does not say."""
        return self.build_limits.max_batch_size

    def iteration_stats(self) -> list[IterationStats]:
        """Stats of the iterations since the previous call (empty if the engine keeps none)."""
        return []

    def health_error(self) -> str | None:
        """None while the engine can serve; otherwise why it cannot."""
        return None

    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer for the text interface, or None if this executor has none."""
        return None
