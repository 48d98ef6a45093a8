"""bench/ttft_split.py against a real server: Triton's statistics and the model's histograms and gauges, read and split
as bench/e2e.py reports them."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from triton_client import stream_once, text_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from ttft_split import describe, gauges, mean_gauges, snapshot, split  # noqa: E402

pytestmark = pytest.mark.e2e


def test_three_requests_one_after_another_split_as_sent(synthetic_server):
    server = synthetic_server
    before, started = snapshot(server.http_url, server.metrics_url), time.monotonic()
    for _ in range(3):
        result = stream_once(server.grpc_url, "tensorrt_llm", text_inputs("hi", 4))
        assert not result.errors and result.finals == 1
    after, seconds = snapshot(server.http_url, server.metrics_url), time.monotonic() - started
    assert after["requests"] - before["requests"] == 3
    parts = split(before, after, seconds)
    assert parts["requests_per_execute"] == 1.0  # each came alone
    assert 0 <= parts["triton_queue_ms"] < 1000
    assert 0 < parts["execute_ms"] < 1000 and 0 < parts["execute_busy"] < 1
    # The synthetic executor's first step comes after 10 ms.
    assert parts["to_executor_ms"] < parts["model_ttft_ms"] and parts["model_ttft_ms"] >= 10
    assert "1.0 requests an execute()" in describe(parts)


def test_nothing_between_two_snapshots_splits_into_nothing(synthetic_server):
    now = snapshot(synthetic_server.http_url, synthetic_server.metrics_url)
    assert all(value is None for value in split(now, now, 1.0).values())


def test_the_gauges_say_where_the_requests_are(synthetic_server):
    samples = [gauges(synthetic_server.metrics_url) for _ in range(2)]
    held = mean_gauges(samples)
    assert held["open"] == 0.0  # nothing in flight between the tests
    assert mean_gauges([]) == {"open": None, "queued": None, "active": None, "context": None}
