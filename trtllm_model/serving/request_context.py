"""The typed state of one request while it is in flight, and the stream it answers on."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..conventions.common import ParsedRequest


class ErrorCode(enum.Enum):
    INVALID_ARG = "INVALID_ARG"
    UNSUPPORTED = "UNSUPPORTED"
    UNAVAILABLE = "UNAVAILABLE"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"


class RequestState(enum.Enum):
    """ACCEPTED: parsed, not yet handed to the executor; RUNNING: the executor has it; ENDED: its final response was
    sent, or could not be because the stream is gone. Only the dispatcher (or a refusal) sets ENDED, right after
    that send, so "ended" and "final response sent" cannot disagree."""

    ACCEPTED = "accepted"
    RUNNING = "running"
    ENDED = "ended"


class ResponseStream(Protocol):
    """Where a request's responses go (a Triton response sender in production, a list in unit tests)."""

    def send(self, outputs: dict[str, np.ndarray] | None, final: bool) -> object:
        """Send one response (None = flag-only); raises if the stream is gone. May return (ns, tensors) spent
        building the response's own tensor objects, for the delivery timers."""

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
    top_log_probs: list[list[tuple[int, float]]] = field(default_factory=list)  # with num_top_log_probs
    cum_log_prob: float | None = None
    num_output_tokens: int = 0
    finish_reason: str | None = None
    # Requested logits, kept for the final response of a non-streaming request.
    context_logits: object | None = None
    context_logits_sent: bool = False
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
    responded: bool = False  # a response was sent: the dispatcher queues it with the running requests
    # A row of a batched request (row_admission.py): its request's rows, and whether it holds one of their slots.
    row_group: object | None = None
    holds_row_slot: bool = False
    # Changed under `lock`; once ENDED the stream must not be touched (see RequestState).
    state: RequestState = RequestState.ACCEPTED
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Timings (time.monotonic_ns) for the latency metrics.
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    enqueued_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0


class BatchStream:
    """One Triton response stream shared by the sequences of a batched request (NVIDIA's batch of several prompts
    in one request): each sequence's responses carry its `batch_index`, as NVIDIA's do, and the FINAL flag goes
    with the final response of the last sequence to end. An error ends the whole request (the other sequences then
    report cancelled, so the poller stops them)."""

    def __init__(self, stream: ResponseStream, size: int) -> None:
        self._stream = stream
        self._open = size
        self._closed = False
        self._lock = threading.Lock()
        self.members = [_BatchMember(self, index) for index in range(size)]

    def send(self, index: int, outputs: dict[str, np.ndarray] | None, final: bool) -> None:
        with self._lock:  # one sender at a time: the stream's last response must be the only FINAL
            if self._closed:
                return
            self._open -= 1 if final else 0
            last = final and self._open == 0
            outputs = {**(outputs or {}), "batch_index": np.array([[index]], dtype=np.int32)}
            self._stream.send(outputs, final=last)
            self._closed = last

    def send_error(self, index: int, code: ErrorCode, message: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stream.send_error(code, f"batch_index {index}: {message}")

    def is_cancelled(self) -> bool:
        with self._lock:  # never asks Triton about a request whose final response has gone
            return self._closed or self._stream.is_cancelled()


@dataclass(frozen=True, slots=True)
class _BatchMember:
    batch: BatchStream
    index: int

    def send(self, outputs: dict[str, np.ndarray] | None, final: bool) -> None:
        self.batch.send(self.index, outputs, final)

    def send_error(self, code: ErrorCode, message: str) -> None:
        self.batch.send_error(self.index, code, message)

    def is_cancelled(self) -> bool:
        return self.batch.is_cancelled()
