"""Two instances of `tensorrt_llm` (instance_group count 2, NVIDIA's gpu_device_ids "0;1") behind a real server,
on the synthetic executor: both load and serve, Triton spreads requests over them, each instance's metrics carry
its `model_instance` label, and a stop ends every open stream of both with one final response each."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import start_server
from prometheus_text import scrape
from triton_client import StreamClient, model_error, stream_once, text_inputs, token_inputs

pytestmark = pytest.mark.e2e

ONE_INSTANCE = "instance_group [ { count: 1, kind: KIND_CPU } ]"
TWO_INSTANCES = "instance_group [ { count: 2, kind: KIND_CPU } ]"
INSTANCES = {"tensorrt_llm_0_0", "tensorrt_llm_0_1"}
STREAMS = 24


def _two_instance_server(tmp_path, gpu_device_ids: str = "0;1", expect_ready: bool = True):
    return start_server(tmp_path, parameters={"synthetic_step_ms": "100", "gpu_device_ids": gpu_device_ids},
                        config_edits={ONE_INSTANCE: TWO_INSTANCES}, expect_ready=expect_ready, new_session=True)


def per_instance(server, name: str, **labels: str) -> dict[str, float]:
    found = scrape(server.metrics_url).find(name, model="tensorrt_llm", **labels)
    return {dict(key).get("model_instance"): value for key, value in found.items()}


def test_requests_spread_over_both_instances_and_each_counts_its_own(tmp_path):
    server = _two_instance_server(tmp_path)
    try:
        assert set(per_instance(server, "nv_llm_open_requests")) == INSTANCES
        # Short requests, sent together: Triton hands them to whichever instance is free.
        with ThreadPoolExecutor(8) as pool:
            finished = list(pool.map(lambda i: stream_once(server.grpc_url, "tensorrt_llm", token_inputs([i + 1], 3)),
                                     range(32)))
        assert all(r.finals == 1 and not r.errors and len(r.tokens()) == 3 for r in finished)
        deadline = time.monotonic() + 10
        while True:
            counts = per_instance(server, "nv_llm_requests_finished_total", finish_reason="length")
            if sum(counts.values()) == 32 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert set(counts) == INSTANCES and sum(counts.values()) == 32, counts
        assert all(count > 0 for count in counts.values()), f"one instance served nothing: {counts}"
    finally:
        server.stop()


def test_a_stop_ends_every_stream_of_both_instances(tmp_path):
    # A fresh server: after many short requests a stop waits out Triton's exit timeout, one instance or two (left
    # to the stop path's owners; reported with a reproduction).
    server = _two_instance_server(tmp_path)
    client = None
    try:
        # Long streams on both models (the ensemble forwards to tensorrt_llm), spread over both instances.
        client = StreamClient(server.grpc_url)
        streams = [client.send("ensemble", text_inputs(f"story {i}", 4000), f"e-{i}") if i % 2 else
                   client.send("tensorrt_llm", token_inputs([i + 1], 4000), f"t-{i}") for i in range(STREAMS)]
        deadline = time.monotonic() + 30
        while not (all(s.responses for s in streams) and
                   all(per_instance(server, "nv_llm_open_requests").get(name, 0) > 0 for name in INSTANCES)):
            assert time.monotonic() < deadline, (per_instance(server, "nv_llm_open_requests"), server.log()[-3000:])
            time.sleep(0.1)
        open_requests = per_instance(server, "nv_llm_open_requests")
        assert sum(open_requests.values()) == STREAMS, open_requests

        server.process.send_signal(signal.SIGTERM)  # to `trtllm-triton serve`, as docker stop or Kubernetes do
        for stream in streams:
            assert stream.done.wait(10), f"a stream got no final response:\n{server.log()[-3000:]}"
        client.close()  # a client done with its requests closes its stream (Triton waits for it before unloading)
        assert server.process.wait(10) == 0, server.log()[-3000:]
        for stream in streams:
            assert stream.finals == 1, (stream.finals, stream.errors)
            assert len(stream.errors) == 1 and model_error(stream.errors[0]).startswith("UNAVAILABLE: "), stream.errors
    finally:
        if client is not None:
            client.close()
        server.stop()


def test_gpu_device_ids_that_do_not_match_the_instance_count_fail_the_load(tmp_path):
    server = _two_instance_server(tmp_path, gpu_device_ids="0;1;2", expect_ready=False)
    try:
        assert server.process.wait(120) != 0
    finally:
        server.stop()
    assert "gpu_device_ids='0;1;2' has 3 GPU group(s) for 2 instance(s)" in server.log()
