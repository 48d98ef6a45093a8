"""Triton custom metrics, kept off the token path.

Every metric call is an IPC round trip to the Triton server, and tritonserver 2.51's Python backend answers metric
(and cancellation) requests on the one thread that takes every message a stub sends, its responses included; so they
are few and batched, and never made at the cost of the sends. The poller's `on_finished` hook
(`MetricsReporter.record_finished`) runs right before a request's final response is sent and appends a small record
to a deque. When the reporter is idle (no flush running, a few records at most) the worker flushes them, its own
included, on its own thread: a scrape that follows a request that ended alone finds it (NVIDIA's checks read the
histograms right after the responses), for the flush's own IPC round trips (3 counters, 6 observations: about 0.7 ms
at one stream on the 2-core machine). Under load the final goes at once and the `metrics` thread flushes within a
period. Flushing records never calls the executor, so a final response never waits on an engine's stats call
(`LLM.get_stats` waits its whole timeout when iteration stats are off), nor on another thread getting the GIL. The
`metrics` thread reads the executor's iteration stats every `stats_check_period_ms`, sets the gauges and observes
what an earlier flush left over. Together they make the few metric calls that are needed:

- gauges (NVIDIA's `nv_trt_llm_*` families) are set only when their value changed, so an idle server makes no
  metric calls at all;
- counters get one `increment` per label per flush, whatever the number of requests;
- histograms get one `observe` per finished request (Triton offers no batched observe). Those calls get a time
  budget per flush (under load `OBSERVE_SHARE` of each period, so sends keep the stub's channel); what doesn't fit
  waits for the next flush, and past `max_backlog` requests under sustained overload the oldest observations are
  dropped and counted in `nv_llm_metrics_dropped_observations_total` (counters stay exact: they are aggregated and
  incremented before any histogram call).

A gauge whose IterationStats field is None for this executor is never created: Prometheus then has no such
series, rather than a made-up constant.

The Triton side is behind `MetricBackend` (built on `pb_utils.MetricFamily` in triton_io.py), so this module
is unit-testable without Triton. See docs/observability.md for what each metric means.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..executor_interface import IterationStats
from .request_context import RequestContext

log = logging.getLogger(__name__)

NS_PER_S = 1e9
US_PER_S = 1_000_000

# NVIDIA's token-length buckets (tensorrtllm_backend's custom metrics reporter).
TOKEN_LEN_BUCKETS = (10.0, 50.0, 100.0, 500.0, 1000.0)
# Latency buckets in seconds: fine where interactive serving lives, coarse out to minutes for long generations.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
QUEUE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

# Finish reasons as the poller reports them (FinishReason values, plus "error") -> the counter's label value.
FINISH_REASON_LABELS = {
    "end_id": "stop",
    "stop_words": "stop",
    "length": "length",
    "cancelled": "cancelled",
    "timeout": "timeout",
    "error": "error",
}
FINISH_REASONS = ("stop", "length", "cancelled", "error", "timeout")

# NVIDIA's gauge families: name -> (description, family label).
REQUEST_FAMILY = "nv_trt_llm_request_metrics"
MEMORY_FAMILY = "nv_trt_llm_runtime_memory_metrics"
KV_CACHE_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
BATCHER_FAMILY = "nv_trt_llm_inflight_batcher_metrics"
GENERAL_FAMILY = "nv_trt_llm_general_metrics"
GAUGE_FAMILIES = {
    REQUEST_FAMILY: ("TRT LLM request metrics", "request_type"),
    MEMORY_FAMILY: ("TRT LLM runtime memory metrics", "memory_type"),
    KV_CACHE_FAMILY: ("TRT LLM KV cache block metrics", "kv_cache_block_type"),
    BATCHER_FAMILY: ("TRT LLM inflight_batcher-specific metrics", "inflight_batcher_specific_metric"),
    GENERAL_FAMILY: ("General TRT LLM metrics", "general_type"),
}
# Ours: requests waiting in the executor's queue, not yet in the batch (NVIDIA's "waiting" means something else).
QUEUED_GAUGE = "nv_llm_queued_requests"
OPEN_GAUGE = "nv_llm_open_requests"  # requests the model holds (accepted, final response not yet sent)

# Per-request metrics.
INPUT_TOKEN_LEN = "nv_llm_input_token_len"
OUTPUT_TOKEN_LEN = "nv_llm_output_token_len"
TTFT = "nv_llm_time_to_first_token_seconds"
TPOT = "nv_llm_time_per_output_token_seconds"
E2E = "nv_llm_e2e_request_latency_seconds"
QUEUE_TIME = "nv_llm_queue_time_seconds"
PROMPT_TOKENS = "nv_llm_prompt_tokens_total"
GENERATION_TOKENS = "nv_llm_generation_tokens_total"
REQUESTS_FINISHED = "nv_llm_requests_finished_total"
DROPPED = "nv_llm_metrics_dropped_observations_total"

# Requests whose histogram observations may wait for a later flush (about 100 bytes each).
MAX_BACKLOG = 10_000
# Time the final flush in finalize() may spend on histogram observations.
FINAL_FLUSH_BUDGET_S = 2.0
# The longest a final response waits for its request's metrics (a slow or failing flush must not hold it longer).
FINAL_WAIT_S = 0.1
# A final flushes the finished records itself only while at most this many wait (its own included): a request that
# ends alone leaves recorded. Beyond that the server is loaded and every metric call is an IPC round trip that holds
# the Python backend's one stub-to-server message thread (tritonserver 2.51 answers metric and cancellation requests
# on it, while sends only pass through it): the final goes at once and the `metrics` thread flushes within a period.
INLINE_FLUSH_MAX_RECORDS = 4
# Under load the `metrics` thread spends at most this share of each period observing histograms (an IPC round trip
# each, 6 per finished request); what doesn't fit waits, and past `max_backlog` it is dropped and counted.
OBSERVE_SHARE = 0.25


# -- the backend: what this module needs from Triton --------------------------------------------------------------
class Counter(Protocol):
    def increment(self, value: float) -> None: ...


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class Histogram(Protocol):
    def observe(self, value: float) -> None: ...


class MetricBackend(Protocol):
    """Creates metrics; each created metric must keep its family alive (Triton raises once a family is gone)."""

    def counter(self, name: str, description: str, labels: dict[str, str]) -> Counter: ...

    def gauge(self, name: str, description: str, labels: dict[str, str]) -> Gauge: ...

    def histogram(self, name: str, description: str, labels: dict[str, str], buckets: Iterable[float]) -> Histogram: ...


# -- what a finished request leaves behind ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FinishedRecord:
    """The few numbers the metrics need from a finished request (the context itself may be large)."""

    arrival_ns: int
    enqueued_ns: int
    first_token_ns: int
    last_token_ns: int
    finished_ns: int
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    ticket: int = 0  # order of recording: the flush reports the last one it observed

    @classmethod
    def from_context(cls, ctx: RequestContext, now_ns: int | None = None, ticket: int = 0) -> FinishedRecord:
        return cls(
            arrival_ns=ctx.arrival_ns,
            enqueued_ns=ctx.enqueued_ns,
            first_token_ns=ctx.first_token_ns,
            last_token_ns=ctx.last_token_ns,
            finished_ns=time.monotonic_ns() if now_ns is None else now_ns,
            prompt_tokens=len(ctx.parsed.prompt_ids),
            output_tokens=ctx.num_output_tokens,
            finish_reason=ctx.finish_reason or "error",
            ticket=ticket,
        )

    def reason_label(self) -> str:
        # A final step without a known reason is an engine fault: count it as an error, never drop it.
        return FINISH_REASON_LABELS.get(self.finish_reason, "error")

    def latencies(self) -> dict[str, float]:
        """Histogram name -> seconds, only for the latencies this request truly has."""
        values = {E2E: (self.finished_ns - self.arrival_ns) / NS_PER_S}
        if self.enqueued_ns:
            values[QUEUE_TIME] = (self.enqueued_ns - self.arrival_ns) / NS_PER_S
        if self.first_token_ns:
            values[TTFT] = (self.first_token_ns - self.arrival_ns) / NS_PER_S
        if self.output_tokens > 1 and self.last_token_ns > self.first_token_ns:
            values[TPOT] = (self.last_token_ns - self.first_token_ns) / NS_PER_S / (self.output_tokens - 1)
        return values


# -- gauges from one iteration -------------------------------------------------------------------------------------
def gauge_values(stats: IterationStats) -> dict[tuple[str, str], float]:
    """(family, label value) -> value for every gauge this iteration truly has (None fields are left out)."""
    kv = stats.kv_cache
    # NVIDIA's "waiting": in the batch but not scheduled this iteration. Clamped: an engine that counts `active`
    # after retiring the iteration's finished requests but `scheduled` before would otherwise go negative.
    waiting = None if stats.scheduled_requests is None else max(0, stats.active_requests - stats.scheduled_requests)
    candidates = {
        (REQUEST_FAMILY, "active"): stats.active_requests,
        (REQUEST_FAMILY, "max"): stats.max_active_requests,
        (REQUEST_FAMILY, "scheduled"): stats.scheduled_requests,
        (REQUEST_FAMILY, "context"): stats.context_requests,
        (REQUEST_FAMILY, "waiting"): waiting,
        (MEMORY_FAMILY, "cpu"): stats.cpu_mem_bytes,
        (MEMORY_FAMILY, "gpu"): stats.gpu_mem_bytes,
        (MEMORY_FAMILY, "pinned"): stats.pinned_mem_bytes,
        (KV_CACHE_FAMILY, "max"): None if kv is None else kv.max_blocks,
        (KV_CACHE_FAMILY, "free"): None if kv is None else kv.free_blocks,
        (KV_CACHE_FAMILY, "used"): None if kv is None else kv.used_blocks,
        (KV_CACHE_FAMILY, "tokens_per"): None if kv is None else kv.tokens_per_block,
        (KV_CACHE_FAMILY, "fraction"): None if kv is None else (kv.used_blocks / kv.max_blocks if kv.max_blocks > 0 else 0.0),
        # NVIDIA's checks expect the series; 0 until an engine reports reused blocks.
        (KV_CACHE_FAMILY, "reused"): None if kv is None else (kv.reused_blocks or 0),
        (BATCHER_FAMILY, "total_context_tokens"): stats.context_tokens,
        (BATCHER_FAMILY, "generation_requests"): stats.generation_requests,
        (BATCHER_FAMILY, "micro_batch_id"): stats.micro_batch_id,
        (BATCHER_FAMILY, "paused_requests"): stats.paused_requests,
        (GENERAL_FAMILY, "timestamp"): int(stats.timestamp * US_PER_S),  # NVIDIA's unit: integer microseconds
        (GENERAL_FAMILY, "iteration_counter"): stats.iteration,
        (QUEUED_GAUGE, ""): stats.queued_requests,
    }
    return {key: float(value) for key, value in candidates.items() if value is not None}


# -- the reporter --------------------------------------------------------------------------------------------------
class MetricsReporter:
    """Aggregates finished requests and executor stats; flushes them to `backend` from its own thread."""

    def __init__(
        self,
        backend: MetricBackend,
        iteration_stats: Callable[[], list[IterationStats]],
        model: str,
        version: str,
        period_s: float = 0.1,
        max_backlog: int = MAX_BACKLOG,
        open_requests: Callable[[], int] | None = None,
        instance: str | None = None,
    ) -> None:
        self.backend = backend
        self.iteration_stats = iteration_stats
        self.labels = {"model": model, "version": version}
        if instance is not None:  # one of several instances (instance_group count > 1): its series apart
            self.labels["model_instance"] = instance
        self.period_s = period_s
        self.max_backlog = max_backlog
        self.open_requests = open_requests
        self._records: deque[FinishedRecord] = deque()  # appended by poller workers, drained by the flush
        self._unobserved: deque[FinishedRecord] = deque()  # counted, histograms not yet observed
        self._gauges: dict[tuple[str, str], Gauge] = {}
        self._gauge_values: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()  # a request ended alone: refresh the gauges now, not at the next period
        self._tickets = itertools.count(1)  # next() is atomic: records from several workers stay ordered
        self._observed = 0  # ticket of the last record a flush observed (or dropped)
        self._flush_lock = threading.Lock()  # one records flush at a time
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._failures = 0
        self._drops = 0
        self._create_request_metrics()

    def _create_request_metrics(self) -> None:
        """Per-request metrics exist from the start (at zero), so rate() and histogram_quantile() work at once."""
        backend, labels = self.backend, self.labels
        self._input_len = backend.histogram(
            INPUT_TOKEN_LEN, "TRT LLM response metrics",
            {**labels, "response_metric_type": "total_input_tokens"}, TOKEN_LEN_BUCKETS,
        )
        self._output_len = backend.histogram(
            OUTPUT_TOKEN_LEN, "TRT LLM response metrics",
            {**labels, "response_metric_type": "total_output_tokens"}, TOKEN_LEN_BUCKETS,
        )
        self._latency = {
            TTFT: backend.histogram(TTFT, "Time from the request reaching the model to its first output token, in seconds", labels, TTFT_BUCKETS),
            TPOT: backend.histogram(TPOT, "Mean time between output tokens of one request (after the first), in seconds", labels, TPOT_BUCKETS),
            E2E: backend.histogram(E2E, "Time from the request reaching the model to its final response, in seconds", labels, E2E_BUCKETS),
            QUEUE_TIME: backend.histogram(QUEUE_TIME, "Time from the request reaching the model to the executor accepting it, in seconds", labels, QUEUE_BUCKETS),
        }
        self._prompt_tokens = backend.counter(PROMPT_TOKENS, "Prompt tokens of finished requests", labels)
        self._generation_tokens = backend.counter(GENERATION_TOKENS, "Tokens generated for finished requests", labels)
        self._finished = {
            reason: backend.counter(REQUESTS_FINISHED, "Finished requests by finish reason", {**labels, "finish_reason": reason})
            for reason in FINISH_REASONS
        }
        self._dropped = backend.counter(
            DROPPED, "Finished requests left out of the histograms because the metrics thread fell behind", labels
        )

    # -- called from the poller workers: no metric calls, no locks ------------------------------------------
    def record_finished(self, ctx: RequestContext) -> None:
        """The poller's on_finished hook, right before the final response. When the reporter is idle (no other
        flush running, at most INLINE_FLUSH_MAX_RECORDS waiting) the request is recorded now, so the response leaves
        recorded; otherwise it is left to the `metrics` thread and the final never waits. No executor call."""
        ticket = next(self._tickets)
        self._records.append(FinishedRecord.from_context(ctx, ticket=ticket))  # deque.append is thread-safe
        if not self._thread.is_alive() or len(self._records) + len(self._unobserved) > INLINE_FLUSH_MAX_RECORDS:
            return
        if not self._flush_lock.acquire(blocking=False):
            return  # another final or the metrics thread is flushing: it or the next period takes this record
        try:
            if self._observed < ticket:  # else a flush that ran meanwhile took it
                self._guarded(self._flush_records, FINAL_WAIT_S)
        finally:
            self._flush_lock.release()
        self._wake.set()  # the gauges follow on the metrics thread (its stats call is not this final's to wait for)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then flush once more so requests that ended during shutdown are counted."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.flush(budget_s=FINAL_FLUSH_BUDGET_S)

    def close(self) -> None:
        """stop(), then let go of every metric object now: each is a Triton object whose destructor talks to the
        server, which must happen while the stub still can (not in a garbage collection of its teardown)."""
        self.stop()
        self._gauges.clear()
        self._latency.clear()
        self._finished.clear()
        self._input_len = self._output_len = self._prompt_tokens = self._generation_tokens = self._dropped = None
        close_backend = getattr(self.backend, "close", None)
        if close_backend is not None:
            close_backend()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.period_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._guarded(self._flush_stats)
            if self._records or self._unobserved:  # left by finals under load, or by a flush out of budget
                with self._flush_lock:
                    self._guarded(self._flush_records, self.period_s * OBSERVE_SHARE)

    # -- the metrics thread --------------------------------------------------------------------------------------------
    def flush(self, budget_s: float | None = None) -> None:
        """Push what changed since the previous flush; a failure is logged and never stops later flushes.

        Histogram observations get `budget_s` (default: one period); the rest wait for the next flush.
        """
        self._guarded(self._flush_stats)
        with self._flush_lock:
            self._guarded(self._flush_records, budget_s)

    def _guarded(self, flush: Callable[..., None], *args) -> None:
        try:
            flush(*args)
        except Exception:
            self._failures += 1
            if self._failures == 1 or self._failures % 1000 == 0:
                log.exception("metrics flush failed (%d failures so far)", self._failures)

    def _flush_stats(self) -> None:
        """Gauges: the executor's latest iteration (a call into the engine) and the requests the model holds."""
        self._flush_gauges()
        self._flush_open_requests()

    def _flush_records(self, budget_s: float | None = None) -> None:
        """Finished requests: counters, then histograms within `budget_s`. No executor call (caller holds
        `_flush_lock`)."""
        records = self._drain()
        self._count(records)  # first, and whole: counters stay exact even when histograms fall behind
        self._unobserved.extend(records)
        self._drop_overflow()
        self._observe(time.monotonic() + (self.period_s if budget_s is None else budget_s))

    def _flush_open_requests(self) -> None:
        if self.open_requests is None:
            return
        value = float(self.open_requests())
        key = (OPEN_GAUGE, "")
        if self._gauge_values.get(key) != value:
            self._gauge(key).set(value)
            self._gauge_values[key] = value

    def _drain(self) -> list[FinishedRecord]:
        records = []
        while True:
            try:
                records.append(self._records.popleft())
            except IndexError:
                return records

    def _flush_gauges(self) -> None:
        stats = self.iteration_stats()
        if not stats:
            return  # no iteration since the last flush: nothing changed
        for key, value in gauge_values(stats[-1]).items():
            if self._gauge_values.get(key) == value:
                continue
            self._gauge(key).set(value)
            self._gauge_values[key] = value

    def _gauge(self, key: tuple[str, str]) -> Gauge:
        gauge = self._gauges.get(key)
        if gauge is None:
            family, label_value = key
            if family == QUEUED_GAUGE:
                gauge = self.backend.gauge(family, "Requests waiting in the executor's queue, not yet in the batch", self.labels)
            elif family == OPEN_GAUGE:
                gauge = self.backend.gauge(family, "Requests the model holds: accepted, final response not yet sent", self.labels)
            else:
                description, label = GAUGE_FAMILIES[family]
                gauge = self.backend.gauge(family, description, {**self.labels, label: label_value})
            self._gauges[key] = gauge
        return gauge

    def _drop_overflow(self) -> None:
        overflow = len(self._unobserved) - self.max_backlog
        if overflow <= 0:
            return
        for _ in range(overflow):
            self._mark_observed(self._unobserved.popleft().ticket)  # dropped: nobody waits for it any longer
        self._dropped.increment(overflow)
        self._drops += 1
        if self._drops == 1 or self._drops % 100 == 0:  # sustained overload: don't flood the log 10 times a second
            log.warning("metrics thread behind: %d finished requests left out of the histograms", overflow)

    def _observe(self, deadline: float) -> None:
        """Observe the histograms of waiting records, oldest first, until `deadline` (at least one record)."""
        while self._unobserved:
            record = self._unobserved.popleft()
            self._input_len.observe(record.prompt_tokens)
            self._output_len.observe(record.output_tokens)
            for name, seconds in record.latencies().items():
                self._latency[name].observe(max(0.0, seconds))
            self._mark_observed(record.ticket)
            if time.monotonic() >= deadline:
                return

    def _mark_observed(self, ticket: int) -> None:
        """Counters and histograms of every record up to `ticket` are in."""
        self._observed = max(self._observed, ticket)

    def _count(self, records: list[FinishedRecord]) -> None:
        if not records:
            return
        finished: dict[str, int] = {}
        for record in records:
            finished[record.reason_label()] = finished.get(record.reason_label(), 0) + 1
        prompt_tokens = sum(r.prompt_tokens for r in records)
        generation_tokens = sum(r.output_tokens for r in records)
        if prompt_tokens:
            self._prompt_tokens.increment(prompt_tokens)
        if generation_tokens:
            self._generation_tokens.increment(generation_tokens)
        for reason, count in finished.items():
            self._finished[reason].increment(count)
