"""The metrics reporter without Triton: a recording backend stands in for pb_utils.MetricFamily."""

from __future__ import annotations

import gc
import importlib
import json
import re
import sys
import threading
import time
import types
import weakref
from pathlib import Path

import pytest
from prometheus_text import parse
from test_poller import ListStream, context

from trtllm_model.executor_interface import IterationStats, KvCacheStats
from trtllm_model.executors.synthetic import SyntheticExecutor
from trtllm_model.serving.metrics import (
    DROPPED,
    E2E,
    GENERATION_TOKENS,
    INLINE_FLUSH_MAX_RECORDS,
    INPUT_TOKEN_LEN,
    OUTPUT_TOKEN_LEN,
    PROMPT_TOKENS,
    QUEUE_TIME,
    REQUESTS_FINISHED,
    TPOT,
    TTFT,
    FinishedRecord,
    MetricsReporter,
)
from trtllm_model.serving.poller import Poller

MS = 1_000_000
ROOT = Path(__file__).resolve().parent.parent


class RecordingBackend:
    """Every metric call is recorded (each one is an IPC round trip in Triton)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.metrics: dict[tuple[str, frozenset], RecordedMetric] = {}
        self.fail_next = False

    def _make(self, kind, name, labels, buckets=None):
        key = (name, frozenset(labels.items()))
        assert key not in self.metrics, f"metric created twice: {key}"
        metric = self.metrics[key] = RecordedMetric(self, kind, name, labels, buckets)
        self.calls.append(("create", name, labels))
        return metric

    def counter(self, name, description, labels):
        return self._make("counter", name, labels)

    def gauge(self, name, description, labels):
        return self._make("gauge", name, labels)

    def histogram(self, name, description, labels, buckets):
        return self._make("histogram", name, labels, list(buckets))

    def get(self, name, **labels) -> RecordedMetric:
        matches = [m for (n, _), m in self.metrics.items() if n == name and labels.items() <= m.labels.items()]
        assert len(matches) == 1, f"{name} {labels}: {len(matches)} matches"
        return matches[0]

    def names(self, name) -> set[str]:
        return {label for (n, labels) in self.metrics for key, label in labels if n == name and key not in ("model", "version")}


class RecordedMetric:
    def __init__(self, backend, kind, name, labels, buckets):
        self.backend, self.kind, self.name, self.labels, self.buckets = backend, kind, name, labels, buckets
        self.value = 0.0
        self.observations: list[float] = []

    def _call(self, op, value):
        if self.backend.fail_next:
            self.backend.fail_next = False
            raise RuntimeError("Invalid metric operation")
        self.backend.calls.append((op, self.name, self.labels, value))

    def increment(self, value):
        assert self.kind == "counter" and value >= 0
        self._call("increment", value)
        self.value += value

    def set(self, value):
        assert self.kind == "gauge"
        self._call("set", value)
        self.value = value

    def observe(self, value):
        assert self.kind == "histogram"
        self._call("observe", value)
        self.observations.append(value)


class StatsFeed:
    def __init__(self) -> None:
        self.pending: list[IterationStats] = []

    def __call__(self) -> list[IterationStats]:
        stats, self.pending = self.pending, []
        return stats


def finished(prompt_len=3, tokens=16, reason="length", arrival=0, enqueued=1 * MS, first=20 * MS, step_ms=10):
    """A finished RequestContext with exact timings (ns): tokens arrive every `step_ms` after the first."""
    ctx = context(list(range(1, prompt_len + 1)), tokens, ListStream())
    ctx.arrival_ns, ctx.enqueued_ns = arrival, enqueued
    ctx.num_output_tokens, ctx.finish_reason = tokens, reason
    if tokens:
        ctx.first_token_ns = first
        ctx.last_token_ns = first + (tokens - 1) * step_ms * MS
    return ctx


@pytest.fixture
def reporter():
    backend, feed = RecordingBackend(), StatsFeed()
    return MetricsReporter(backend, feed, model="tensorrt_llm", version="1"), backend, feed


def test_request_metrics_exist_at_zero_from_the_start(reporter):
    _, backend, _ = reporter
    assert backend.get(GENERATION_TOKENS).value == 0
    assert backend.names(REQUESTS_FINISHED) == {"stop", "length", "cancelled", "error", "timeout"}
    assert backend.get(INPUT_TOKEN_LEN).labels == {"model": "tensorrt_llm", "version": "1", "response_metric_type": "total_input_tokens"}
    assert backend.get(OUTPUT_TOKEN_LEN).labels["response_metric_type"] == "total_output_tokens"
    assert backend.get(OUTPUT_TOKEN_LEN).buckets == [10, 50, 100, 500, 1000]
    assert all(op == "create" for op, *_ in backend.calls)


def test_record_finished_makes_no_metric_call_until_the_flush(reporter):
    metrics, backend, _ = reporter
    created = len(backend.calls)
    for _ in range(10):
        metrics.record_finished(finished())
    assert len(backend.calls) == created
    metrics.flush()
    assert len(backend.calls) > created


def test_ten_requests_of_sixteen_tokens_give_exact_values(reporter):
    metrics, backend, _ = reporter
    for _ in range(10):
        metrics.record_finished(finished(prompt_len=3, tokens=16, arrival=0, enqueued=1 * MS, first=20 * MS, step_ms=10))
    metrics.flush()
    assert backend.get(GENERATION_TOKENS).value == 160
    assert backend.get(PROMPT_TOKENS).value == 30
    assert backend.get(REQUESTS_FINISHED, finish_reason="length").value == 10
    assert backend.get(REQUESTS_FINISHED, finish_reason="stop").value == 0
    assert backend.get(OUTPUT_TOKEN_LEN).observations == [16] * 10
    assert backend.get(INPUT_TOKEN_LEN).observations == [3] * 10
    assert backend.get(TTFT).observations == pytest.approx([0.020] * 10)
    assert backend.get(TPOT).observations == pytest.approx([0.010] * 10)
    assert backend.get(QUEUE_TIME).observations == pytest.approx([0.001] * 10)
    assert len(backend.get(E2E).observations) == 10
    # Counters are aggregated: one increment per counter per flush, however many requests ended.
    increments = [c for c in backend.calls if c[0] == "increment"]
    assert len(increments) == 3  # prompt tokens, generated tokens, finished{length}


def test_finish_reasons_map_to_the_five_labels(reporter):
    metrics, backend, _ = reporter
    for reason in ("end_id", "stop_words", "length", "cancelled", "timeout", "error", "not_finished"):
        metrics.record_finished(finished(reason=reason))
    metrics.flush()
    counts = {r: backend.get(REQUESTS_FINISHED, finish_reason=r).value for r in ("stop", "length", "cancelled", "timeout", "error")}
    assert counts == {"stop": 2, "length": 1, "cancelled": 1, "timeout": 1, "error": 2}


def test_latencies_a_request_does_not_have_are_not_observed(reporter):
    metrics, backend, _ = reporter
    metrics.record_finished(finished(tokens=0, reason="error"))  # failed before any token
    metrics.record_finished(finished(tokens=1))  # one token: no time between tokens
    metrics.flush()
    assert len(backend.get(TTFT).observations) == 1
    assert backend.get(TPOT).observations == []
    assert len(backend.get(E2E).observations) == 2
    assert backend.get(OUTPUT_TOKEN_LEN).observations == [0, 1]


def synthetic_stats(iteration=1, active=2, queued=0):
    return IterationStats(
        timestamp=1700000000.0 + iteration, iteration=iteration, active_requests=active, queued_requests=queued,
        max_active_requests=64, scheduled_requests=active, tokens_in_step=active,
    )


def test_gauges_only_for_fields_the_executor_has(reporter):
    metrics, backend, feed = reporter
    feed.pending = [synthetic_stats(iteration=1, active=5), synthetic_stats(iteration=2, active=3, queued=4)]
    metrics.flush()
    assert backend.names("nv_trt_llm_request_metrics") == {"active", "max", "scheduled", "waiting"}  # no "context"
    assert backend.get("nv_trt_llm_request_metrics", request_type="active").value == 3  # the latest iteration
    assert backend.get("nv_trt_llm_request_metrics", request_type="waiting").value == 0
    assert backend.get("nv_trt_llm_general_metrics", general_type="iteration_counter").value == 2
    assert backend.get("nv_llm_queued_requests").value == 4
    for family in ("nv_trt_llm_runtime_memory_metrics", "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_inflight_batcher_metrics"):
        assert backend.names(family) == set(), family


def test_waiting_is_never_negative(reporter):
    metrics, backend, feed = reporter
    # The last iteration of a request as the transformers engine reports it: retired (active 0), yet scheduled.
    feed.pending = [synthetic_stats(iteration=8, active=0)]
    feed.pending[0].scheduled_requests = 1
    metrics.flush()
    assert backend.get("nv_trt_llm_request_metrics", request_type="waiting").value == 0

def test_a_full_engine_fills_every_nvidia_label(reporter):
    metrics, backend, feed = reporter
    feed.pending = [
        IterationStats(
            timestamp=1700000000.5, iteration=7, active_requests=6, queued_requests=1, max_active_requests=64,
            scheduled_requests=4, context_requests=1, generation_requests=3, context_tokens=120, paused_requests=0,
            micro_batch_id=0, cpu_mem_bytes=10, gpu_mem_bytes=20, pinned_mem_bytes=30,
            kv_cache=KvCacheStats(max_blocks=200, free_blocks=150, used_blocks=50, tokens_per_block=64),
        )
    ]
    metrics.flush()
    assert backend.names("nv_trt_llm_request_metrics") == {"active", "max", "scheduled", "context", "waiting"}
    assert backend.get("nv_trt_llm_request_metrics", request_type="waiting").value == 2  # active - scheduled
    assert backend.names("nv_trt_llm_runtime_memory_metrics") == {"cpu", "gpu", "pinned"}
    assert backend.get("nv_trt_llm_runtime_memory_metrics", memory_type="gpu").value == 20
    assert backend.names("nv_trt_llm_kv_cache_block_metrics") == {"max", "free", "used", "tokens_per", "fraction", "reused"}
    assert backend.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction").value == 0.25
    # NVIDIA's checks expect the series even from an engine that never reuses blocks.
    assert backend.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="reused").value == 0
    assert backend.names("nv_trt_llm_inflight_batcher_metrics") == {
        "total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"
    }
    # NVIDIA's unit: integer microseconds since the epoch.
    assert backend.get("nv_trt_llm_general_metrics", general_type="timestamp").value == 1700000000500000


def test_idle_flushes_make_no_metric_calls(reporter):
    metrics, backend, feed = reporter
    feed.pending = [synthetic_stats(iteration=1, active=0)]
    metrics.flush()
    calls = len(backend.calls)
    for _ in range(5):
        metrics.flush()  # no iteration, no finished request
    assert len(backend.calls) == calls
    # A new iteration that changes only the counter and timestamp sets only those two gauges.
    feed.pending = [synthetic_stats(iteration=2, active=0)]
    metrics.flush()
    assert {(op, name, labels.get("general_type")) for op, name, labels, *_ in backend.calls[calls:]} == {
        ("set", "nv_trt_llm_general_metrics", "iteration_counter"), ("set", "nv_trt_llm_general_metrics", "timestamp")
    }


def test_a_failing_flush_does_not_stop_later_ones(reporter):
    metrics, backend, _ = reporter
    backend.fail_next = True
    metrics.record_finished(finished())
    metrics.flush()  # raises inside, logged
    metrics.record_finished(finished())
    metrics.flush()
    assert backend.get(GENERATION_TOKENS).value == 16


def test_histograms_that_miss_the_budget_wait_for_the_next_flush_counters_do_not(reporter):
    metrics, backend, _ = reporter
    for _ in range(3):
        metrics.record_finished(finished())
    metrics.flush(budget_s=0)  # the budget is spent after the first request's observations
    assert backend.get(GENERATION_TOKENS).value == 48
    assert backend.get(REQUESTS_FINISHED, finish_reason="length").value == 3
    assert len(backend.get(OUTPUT_TOKEN_LEN).observations) == 1
    metrics.flush(budget_s=0)
    metrics.flush(budget_s=0)
    assert len(backend.get(OUTPUT_TOKEN_LEN).observations) == 3
    assert len(backend.get(TTFT).observations) == 3
    assert backend.get(GENERATION_TOKENS).value == 48  # counted once


def test_backlog_past_its_bound_drops_the_oldest_observations_and_counts_them():
    backend, feed = RecordingBackend(), StatsFeed()
    metrics = MetricsReporter(backend, feed, model="m", version="1", max_backlog=5)
    for tokens in range(1, 13):
        metrics.record_finished(finished(tokens=tokens))
    metrics.flush(budget_s=0)
    assert backend.get(DROPPED).value == 7
    assert backend.get(OUTPUT_TOKEN_LEN).observations == [8]  # the oldest kept one
    assert backend.get(GENERATION_TOKENS).value == sum(range(1, 13))  # counters are exact regardless
    metrics.flush()
    assert backend.get(OUTPUT_TOKEN_LEN).observations == [8, 9, 10, 11, 12]
    assert backend.get(DROPPED).value == 7

def test_thread_flushes_on_its_period_and_stop_flushes_the_rest():
    backend, feed = RecordingBackend(), StatsFeed()
    metrics = MetricsReporter(backend, feed, model="m", version="1", period_s=0.02)
    metrics.start()
    try:
        metrics.record_finished(finished())
        deadline = time.monotonic() + 2
        while backend.get(GENERATION_TOKENS).value == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert backend.get(GENERATION_TOKENS).value == 16
    finally:
        metrics.stop()
    assert not any(t.name == "metrics" and t.is_alive() for t in threading.enumerate())
    metrics.record_finished(finished())  # as a request ended during shutdown
    metrics.stop()
    assert backend.get(GENERATION_TOKENS).value == 32


def test_with_the_real_poller_and_synthetic_executor():
    backend, executor = RecordingBackend(), SyntheticExecutor(step_ms=2.0)
    metrics = MetricsReporter(backend, executor.iteration_stats, model="m", version="1", period_s=0.02)
    poller = Poller(executor, on_finished=metrics.record_finished)
    metrics.start()
    poller.start()
    streams = [ListStream() for _ in range(10)]
    for i, stream in enumerate(streams):
        poller.submit(context([i + 1, 7], 16, stream))
    for stream in streams:
        assert stream.done.wait(10)
    poller.shutdown()
    metrics.stop()
    assert backend.get(GENERATION_TOKENS).value == 160
    assert backend.get(PROMPT_TOKENS).value == 20
    assert backend.get(REQUESTS_FINISHED, finish_reason="length").value == 10
    for name in (TTFT, TPOT, E2E, QUEUE_TIME, INPUT_TOKEN_LEN, OUTPUT_TOKEN_LEN):
        assert len(backend.get(name).observations) == 10, name
    assert all(0 < t < 1 for t in backend.get(TPOT).observations)
    assert backend.get("nv_trt_llm_request_metrics", request_type="active").value == 0
    assert backend.get("nv_trt_llm_general_metrics", general_type="iteration_counter").value >= 16


def test_parser_reads_escapes_and_special_values():
    text = '# TYPE x histogram\nx_bucket{a="q\\"uote",le="+Inf"} 3\ny 1.5e3 1700000000\nz{} NaN\n'
    parsed = parse(text)
    assert parsed.value("x_bucket", a='q"uote', le="+Inf") == 3
    assert parsed.value("y") == 1500
    assert parsed.types == {"x": "histogram"}
    assert parsed.find("z")


# -- the pb_utils adapter -------------------------------------------------------------------------------------------
class FakeMetricFamily:
    """Like pb_utils.MetricFamily: its metrics raise once the family was garbage-collected."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels, buckets=None):  # noqa: N802 (pb_utils' name)
        assert (buckets is not None) == (self.kind == "histogram")
        return FakeMetric(weakref.ref(self))


class FakeMetric:
    def __init__(self, family_ref):
        self.family_ref, self.values = family_ref, []

    def _use(self, value):
        if self.family_ref() is None:
            raise RuntimeError("Invalid metric operation as the corresponding 'MetricFamily' has been deleted")
        self.values.append(value)

    increment = set = observe = _use


@pytest.fixture
def triton_io(monkeypatch):
    fake = types.ModuleType("triton_python_backend_utils")
    fake.MetricFamily = FakeMetricFamily
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "trtllm_model.triton.triton_io", raising=False)
    yield importlib.import_module("trtllm_model.triton.triton_io")
    sys.modules.pop("trtllm_model.triton.triton_io", None)


def test_triton_backend_keeps_families_alive_as_long_as_their_metrics(triton_io):
    backend = triton_io.TritonMetricBackend()
    counter = backend.counter("c_total", "d", {"model": "m"})
    histogram = backend.histogram("h", "d", {"model": "m"}, (1, 2))
    del backend
    gc.collect()
    counter.increment(3)
    histogram.observe(1.5)
    assert counter._metric.values == [3] and histogram._metric.values == [1.5]


def test_triton_backend_makes_one_family_per_name(triton_io):
    backend = triton_io.TritonMetricBackend()
    a = backend.gauge("g", "d", {"type": "a"})
    b = backend.gauge("g", "d", {"type": "b"})
    assert a._family is b._family


# -- the dashboard and the docs name what the model exports ----------------------------------------------------------
def exported_series() -> dict[str, set[str]]:
    """Metric name -> the values of its family label (empty set: no family label), as the reporter exports them."""
    backend, feed = RecordingBackend(), StatsFeed()
    metrics = MetricsReporter(backend, feed, model="m", version="1", open_requests=lambda: 3)
    feed.pending = [
        IterationStats(
            timestamp=1.0, iteration=1, active_requests=1, queued_requests=1, max_active_requests=1,
            scheduled_requests=1, context_requests=1, generation_requests=1, context_tokens=1, paused_requests=1,
            micro_batch_id=1, cpu_mem_bytes=1, gpu_mem_bytes=1, pinned_mem_bytes=1,
            kv_cache=KvCacheStats(max_blocks=1, free_blocks=1, used_blocks=1, tokens_per_block=1),
        )
    ]
    metrics.flush()
    series: dict[str, set[str]] = {}
    for name, labels in backend.metrics:
        values = series.setdefault(name, set())
        values.update(value for key, value in labels if key not in ("model", "version", "finish_reason"))
    return series


def test_dashboard_queries_only_exported_series():
    dashboard = json.loads((ROOT / "docs" / "grafana" / "trtllm-triton.json").read_text())
    series = exported_series()
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = set()
    for expr in exprs:
        for name, selector in re.findall(r"\b(nv_(?:llm|trt_llm)_[a-z0-9_]+?)(?:_bucket|_sum|_count)?\{([^}]*)\}", expr):
            assert name in series, f"dashboard queries {name}, which the model does not export"
            for value in re.findall(r'(?:request_type|memory_type|kv_cache_block_type|general_type|inflight_batcher_specific_metric)="([a-z_]+)"', selector):
                assert value in series[name], f"{name}: no series with label value {value}"
            used.add(name)
    assert used == set(series), f"not on the dashboard: {set(series) - used}"


def test_docs_name_every_exported_metric():
    docs = (ROOT / "docs" / "observability.md").read_text()
    for name, values in exported_series().items():
        assert f"`{name}" in docs, name
        for value in values:
            assert f"`{value}`" in docs or f'"{value}"' in docs, f"{name}: {value}"


def test_open_requests_gauge_follows_the_poller_and_is_set_only_on_change():
    backend, feed, held = RecordingBackend(), StatsFeed(), [2]
    metrics = MetricsReporter(backend, feed, model="m", version="1", open_requests=lambda: held[0])
    metrics.flush()
    assert backend.get("nv_llm_open_requests").value == 2
    held[0] = 0
    metrics.flush()
    assert backend.get("nv_llm_open_requests").value == 0


def test_a_finished_request_is_in_the_histograms_long_before_the_stats_period():
    # NVIDIA's metric checks read nv_llm_*_token_len right after the responses: a finished request wakes the
    # metrics thread instead of waiting for the next stats_check_period_ms (here 30 s).
    backend = RecordingBackend()
    metrics = MetricsReporter(backend, StatsFeed(), model="tensorrt_llm", version="1", period_s=30.0)
    metrics.start()
    try:
        time.sleep(0.05)  # the thread is waiting on its period
        started = time.monotonic()
        metrics.record_finished(finished(prompt_len=3, tokens=16))
        while not backend.get(OUTPUT_TOKEN_LEN).observations and time.monotonic() - started < 5:
            time.sleep(0.001)
        assert backend.get(OUTPUT_TOKEN_LEN).observations == [16]
        assert backend.get(INPUT_TOKEN_LEN).observations == [3]
        assert backend.get(GENERATION_TOKENS).value == 16
        assert time.monotonic() - started < 1.0
    finally:
        metrics.stop()


class SlowStats(StatsFeed):
    """An executor whose stats call blocks (LLM.get_stats waits its whole timeout when iteration stats are off)."""

    def __init__(self, block_s: float) -> None:
        super().__init__()
        self.block_s = block_s
        self.calls = 0

    def __call__(self) -> list[IterationStats]:
        self.calls += 1
        time.sleep(self.block_s)
        return super().__call__()


def test_a_final_response_never_waits_on_the_executors_stats_call():
    # The stats call blocks 1 s and is under way nearly all the time (period 20 ms). The request is recorded by the
    # time record_finished returns (its final response then leaves), with no wait on the stats call.
    backend, stats = RecordingBackend(), SlowStats(1.0)
    metrics = MetricsReporter(backend, stats, model="tensorrt_llm", version="1", period_s=0.02)
    metrics.start()
    try:
        deadline = time.monotonic() + 5
        while not stats.calls and time.monotonic() < deadline:
            time.sleep(0.005)
        assert stats.calls, "the stats call never began"
        started = time.monotonic()
        metrics.record_finished(finished(prompt_len=3, tokens=16))
        waited = time.monotonic() - started
        assert backend.get(GENERATION_TOKENS).value == 16  # a scrape now counts the request
        assert backend.get(REQUESTS_FINISHED, finish_reason="length").value == 1
        assert backend.get(OUTPUT_TOKEN_LEN).observations == [16]
        assert waited < 0.5, f"record_finished waited {waited:.3f} s"
    finally:
        metrics.stop()


def test_under_load_a_final_never_waits_for_another_flush_and_the_metrics_thread_records_it():
    # Another flush holds the lock (as a final or the metrics thread mid-flush at 256 streams): a final's
    # record_finished returns at once, makes no metric call, and the metrics thread counts the request within periods.
    backend = RecordingBackend()
    metrics = MetricsReporter(backend, StatsFeed(), model="tensorrt_llm", version="1", period_s=0.02)
    metrics.start()
    try:
        with metrics._flush_lock:
            started = time.monotonic()
            metrics.record_finished(finished(prompt_len=3, tokens=16))
            waited = time.monotonic() - started
            assert backend.get(GENERATION_TOKENS).value == 0, "recorded while another flush held the lock"
        assert waited < 0.05, f"record_finished waited {waited:.3f} s for another flush"
        deadline = time.monotonic() + 5
        while backend.get(GENERATION_TOKENS).value != 16 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert backend.get(GENERATION_TOKENS).value == 16
        assert backend.get(OUTPUT_TOKEN_LEN).observations == [16]
    finally:
        metrics.stop()


def test_with_records_waiting_beyond_the_inline_bound_a_final_leaves_them_to_the_metrics_thread():
    backend = RecordingBackend()
    metrics = MetricsReporter(backend, StatsFeed(), model="tensorrt_llm", version="1", period_s=30.0)
    metrics.start()
    try:
        for _ in range(INLINE_FLUSH_MAX_RECORDS + 1):  # appended without a flush: as finals arriving together
            metrics._records.append(FinishedRecord.from_context(finished(tokens=2)))
        metrics.record_finished(finished(tokens=2))
        assert backend.get(GENERATION_TOKENS).value == 0  # left for the metrics thread (its period here is 30 s)
    finally:
        metrics.stop()
    assert backend.get(GENERATION_TOKENS).value == 2 * (INLINE_FLUSH_MAX_RECORDS + 2)  # stop() flushes them
