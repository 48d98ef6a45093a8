"""The typed state of one request while it is in flight, and the stream it answers on."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .conversion import ParsedRequest


class ErrorCode(enum.Enum):
    INVALID_ARG = "INVALID_ARG"
    UNSUPPORTED = "UNSUPPORTED"
    UNAVAILABLE = "UNAVAILABLE"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"


class ResponseStream(Protocol):
    """Where a request's responses go (a Triton response sender in production, a list in unit tests)."""

    def send(self, outputs: dict[str, np.ndarray] | None, final: bool) -> None:
        """Send one response (None = flag-only); raises if the stream is gone."""

    def send_error(self, code: ErrorCode, message: str) -> None:
        """Send an error response that is also the final one."""

    def is_cancelled(self) -> bool:
        """Whether the client cancelled (an IPC round trip in Triton: call it in bulk, off the token path)."""


@dataclass(eq=False, slots=True)
class RequestContext:
    parsed: ParsedRequest
    stream: ResponseStream
    triton_request_id: str = ""
    detokenizer: object | None = None  # IncrementalDetokenizer for text requests
    executor_id: int = -1
    # Accumulated output (whole output for non-streaming responses; counts for everyone).
    output_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float | None = None
    num_output_tokens: int = 0
    finish_reason: str | None = None
    # Requested logits, kept for the final response of a non-streaming request.
    context_logits: object | None = None
    generation_logits: list = field(default_factory=list)
    # KV-cache block counts for return_perf_metrics (the executor's latest; None where it counts none).
    kv_cache_blocks: dict[str, int] = field(default_factory=dict)
    cancel_requested: bool = False
    # Cancelled by NVIDIA's `stop` input (not by its own client): it ends with a normal final response carrying
    # the tokens so far and finish reason "cancelled", as in NVIDIA's model; a client that cancelled gets CANCELLED.
    stopped: bool = False
    # Poller state, under the poller's work lock: steps and failures not yet delivered, and whether the request
    # is in the ready queue or being delivered (then it is not queued again).
    mailbox: list = field(default_factory=list)
    scheduled: bool = False
    # Set (under `lock`) before the final response is sent; the stream must not be touched afterwards.
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Timings (time.monotonic_ns) for the latency metrics.
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    enqueued_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
