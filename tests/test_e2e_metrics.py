"""What Prometheus scrapes from a real tritonserver after a known workload (synthetic executor, own server)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import start_server
from prometheus_text import scrape
from triton_client import StreamClient, token_inputs
from trtllm_support import fake_engine_repository

pytestmark = pytest.mark.e2e

LABELS = {"model": "tensorrt_llm", "version": "1"}
HISTOGRAMS = (
    "nv_llm_time_to_first_token_seconds",
    "nv_llm_time_per_output_token_seconds",
    "nv_llm_e2e_request_latency_seconds",
    "nv_llm_queue_time_seconds",
    "nv_llm_input_token_len",
    "nv_llm_output_token_len",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    parameters = {"stats_check_period_ms": "50", "max_batch_size": "64"}
    server = start_server(tmp_path_factory.mktemp("metrics"), executor="synthetic", parameters=parameters)
    yield server
    server.stop()


def run_requests(server, requests: list[tuple[list, dict | None]]) -> None:
    """Send every (inputs, parameters) on one gRPC stream at once and wait for all the finals."""
    client = StreamClient(server.grpc_url)
    try:
        results = [client.send("tensorrt_llm", inputs, f"r{i}", parameters) for i, (inputs, parameters) in enumerate(requests)]
        for result in results:
            result.wait(30)
    finally:
        client.close()


def wait_for(server, condition, timeout_s: float = 5.0):
    """Scrape until `condition(scrape)` holds: metrics are flushed every stats_check_period_ms, not at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = scrape(server.metrics_url)
        if condition(current) or time.monotonic() > deadline:
            return current
        time.sleep(0.05)


def test_known_workload_gives_exact_counts_and_idle_gauges(server):
    before = scrape(server.metrics_url)
    assert before.value("nv_llm_generation_tokens_total", **LABELS) == 0  # our own server: counters start at zero
    for name in HISTOGRAMS:
        assert before.types[name] == "histogram", name

    run_requests(server, [(token_inputs([i + 1, 2, 3], 16), None) for i in range(10)])
    after = wait_for(server, lambda s: s.value("nv_llm_generation_tokens_total", **LABELS) >= 160
                     and all(s.value(f"{name}_count", **LABELS) >= 10 for name in HISTOGRAMS))

    assert after.value("nv_llm_generation_tokens_total", **LABELS) == 160
    assert after.value("nv_llm_prompt_tokens_total", **LABELS) == 30
    reasons = {r: after.value("nv_llm_requests_finished_total", finish_reason=r, **LABELS) for r in ("stop", "length", "cancelled", "error", "timeout")}
    assert reasons == {"stop": 0, "length": 10, "cancelled": 0, "error": 0, "timeout": 0}
    for name in HISTOGRAMS:
        assert after.value(f"{name}_count", **LABELS) == 10, name
    assert after.value("nv_llm_metrics_dropped_observations_total", **LABELS) == 0
    # NVIDIA's token-length histograms: their label, their buckets, exact sums.
    output = {"response_metric_type": "total_output_tokens", **LABELS}
    assert after.value("nv_llm_output_token_len_sum", **output) == 160
    assert after.value("nv_llm_input_token_len_sum", response_metric_type="total_input_tokens", **LABELS) == 30
    assert after.label_values("nv_llm_output_token_len_bucket", "le") == {"10", "50", "100", "500", "1000", "+Inf"}
    assert after.value("nv_llm_output_token_len_bucket", le="10", **output) == 0
    assert after.value("nv_llm_output_token_len_bucket", le="50", **output) == 10
    # 10 ms synthetic steps: a token every ~10 ms, so the mean per-token time is well under 100 ms.
    assert 0 < after.value("nv_llm_time_per_output_token_seconds_sum", **LABELS) / 10 < 0.1

    idle = wait_for(server, lambda s: s.value("nv_trt_llm_request_metrics", request_type="active", **LABELS) == 0)
    request_gauges = {t: idle.value("nv_trt_llm_request_metrics", request_type=t, **LABELS) for t in ("active", "scheduled", "waiting", "max")}
    assert request_gauges == {"active": 0, "scheduled": 0, "waiting": 0, "max": 64}
    assert idle.value("nv_llm_queued_requests", **LABELS) == 0
    assert idle.value("nv_trt_llm_general_metrics", general_type="iteration_counter", **LABELS) >= 16
    stamp = idle.value("nv_trt_llm_general_metrics", general_type="timestamp", **LABELS)
    assert stamp == int(stamp) and abs(stamp / 1e6 - time.time()) < 60  # NVIDIA's unit: integer microseconds
    # The synthetic executor has no memory, KV cache or batcher internals: those series don't exist.
    for family in ("nv_trt_llm_runtime_memory_metrics", "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_inflight_batcher_metrics"):
        assert not idle.find(family), family
    assert idle.label_values("nv_trt_llm_request_metrics", "request_type") == {"active", "max", "scheduled", "waiting"}


def test_finish_reasons_stop_and_error_are_counted(server):
    before = scrape(server.metrics_url)
    count = {r: before.value("nv_llm_requests_finished_total", finish_reason=r, **LABELS) for r in ("stop", "error")}
    # Input [5] makes tokens 6, 7, 8, ...: end_id 8 stops after 3 tokens; the fault ends the other after 2.
    run_requests(server, [
        (token_inputs([5], 50, end_id=(8, np.int32)), None),
        (token_inputs([5], 50), {"synthetic_fault_error_at": 2}),
    ])
    after = wait_for(server, lambda s: s.value("nv_llm_requests_finished_total", finish_reason="error", **LABELS) > count["error"])
    assert after.value("nv_llm_requests_finished_total", finish_reason="stop", **LABELS) == count["stop"] + 1
    assert after.value("nv_llm_requests_finished_total", finish_reason="error", **LABELS) == count["error"] + 1



def test_trtllm_engine_fills_every_nvidia_family(tmp_path):
    """Over the fake tensorrt_llm: the stats a real Executor returns reach /metrics under NVIDIA's names."""
    repository = fake_engine_repository(tmp_path)
    server = start_server(tmp_path, executor="trtllm_engine", env={"FAKE_TRTLLM_STEP_MS": "2"}, repository=repository)
    try:
        run_requests(server, [(token_inputs([i + 1, 2], 8), None) for i in range(4)])
        done = wait_for(server, lambda s: s.value("nv_llm_generation_tokens_total", **LABELS) >= 32)
        assert done.value("nv_llm_generation_tokens_total", **LABELS) == 32
        expected = {
            "nv_trt_llm_request_metrics": ("request_type", {"active", "max", "scheduled", "context", "waiting"}),
            "nv_trt_llm_runtime_memory_metrics": ("memory_type", {"cpu", "gpu", "pinned"}),
            "nv_trt_llm_kv_cache_block_metrics": ("kv_cache_block_type", {"max", "free", "used", "tokens_per", "fraction", "reused"}),
            "nv_trt_llm_inflight_batcher_metrics": (
                "inflight_batcher_specific_metric",
                {"total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"},
            ),
            "nv_trt_llm_general_metrics": ("general_type", {"timestamp", "iteration_counter"}),
        }
        for family, (label, values) in expected.items():
            assert done.types[family] == "gauge"
            assert done.label_values(family, label) == values, family
        # The fake reports 1 GiB of GPU memory and 32 tokens per block of 1024.
        assert done.value("nv_trt_llm_runtime_memory_metrics", memory_type="gpu", **LABELS) == 1 << 30
        assert done.value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per", **LABELS) == 32
        assert done.value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max", **LABELS) == 1024
    finally:
        server.stop()


def test_a_final_response_does_not_wait_on_a_slow_engine_stats_call(tmp_path):
    """The engine's stats call blocks 1 s (as LLM.get_stats waits its whole timeout when iteration stats are off): a
    request that ends alone still gets its final response at once, and a scrape right after it counts the request."""
    repository = fake_engine_repository(tmp_path)
    env = {"FAKE_TRTLLM_STEP_MS": "2", "FAKE_TRTLLM_STATS_BLOCK_S": "1"}
    server = start_server(tmp_path, executor="trtllm_engine", env=env, repository=repository)
    reasons = ("stop", "length", "cancelled", "error", "timeout")
    try:
        run_requests(server, [(token_inputs([9, 2], 4), None)])  # the first request warms up the client and server
        for i in range(2, 5):
            started = time.monotonic()
            run_requests(server, [(token_inputs([i, 2], 4), None)])
            took = time.monotonic() - started
            now = scrape(server.metrics_url)
            assert sum(now.value("nv_llm_requests_finished_total", finish_reason=r, **LABELS) for r in reasons) == i
            assert now.value("nv_llm_generation_tokens_total", **LABELS) == 4 * i
            assert now.value("nv_llm_output_token_len_count", response_metric_type="total_output_tokens", **LABELS) == i
            assert took < 0.5, f"request {i} took {took:.2f} s: its final response waited on the stats call"
    finally:
        server.stop()
