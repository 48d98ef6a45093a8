"""End to end: two instances of `tensorrt_llm` (instance_group count 2) with the embedded engine in its worker process
share one worker behind a real tritonserver. Both serve, the same prompt gets the same greedy tokens whichever
instance took it, and when the worker is killed every open stream of both instances ends with one UNAVAILABLE final
and the model reports not ready; the worker never outlives the server."""

from __future__ import annotations

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from test_e2e_engine_process import engine_workers, signal_once_streaming
from test_e2e_multi_instance import INSTANCES, ONE_INSTANCE, TWO_INSTANCES, per_instance
from test_shared_engine import exited
from triton_client import StreamClient, stream_once, token_inputs, wait_until_streaming

pytestmark = pytest.mark.e2e

PROMPTS = ([1, 504, 3575], [1, 9690, 28, 253])


def test_two_instances_share_one_engine_worker_both_serve_and_its_death_ends_every_stream_of_both(tmp_path):
    server = start_server(tmp_path, executor="transformers", parameters={"max_batch_size": "8", "engine_process": "true"},
                          config_edits={ONE_INSTANCE: TWO_INSTANCES}, new_session=True)
    try:
        (worker,) = engine_workers(server)
        attached = re.findall(r"stub (\d) \(pid \d+\) attached; (\d) of 2", server.log())
        assert sorted(attached) == [("1", "1"), ("2", "2")], server.log()[-3000:]

        # Short requests from 8 threads: Triton hands them to whichever instance is free.
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(
                lambda i: stream_once(server.grpc_url, "tensorrt_llm", token_inputs(PROMPTS[i % 2], 6), timeout_s=120),
                range(24)))
        assert all(r.finals == 1 and not r.errors and len(r.tokens()) == 6 for r in results), \
            [r.errors for r in results]
        for first in (0, 1):
            assert len({tuple(r.tokens()) for r in results[first::2]}) == 1, [r.tokens() for r in results]
        deadline = time.monotonic() + 10
        while True:  # a request is counted just after its final response is sent
            counts = per_instance(server, "nv_llm_requests_finished_total", finish_reason="length")
            if sum(counts.values()) == 24 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert set(counts) == INSTANCES and sum(counts.values()) == 24, counts
        assert all(count > 0 for count in counts.values()), f"one instance served nothing: {counts}"

        # Long streams on both instances, then the shared worker dies.
        client = StreamClient(server.grpc_url)
        streams = []
        while not all(per_instance(server, "nv_llm_open_requests").get(name, 0) > 0 for name in INSTANCES):
            # One at a time until each instance holds one: Triton may hand requests sent together to one instance.
            assert len(streams) < 8, per_instance(server, "nv_llm_open_requests")  # max_batch_size: all run
            streams.append(client.send("tensorrt_llm", token_inputs([1, 504, 3575 + len(streams)], 4000,
                                                                    min_tokens=(4000, np.int32)), f"t{len(streams)}"))
            time.sleep(0.5)
        signal_once_streaming(worker, streams, signal.SIGKILL, 5.0, "engine worker exited")
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + 10
        while grpc_client.is_model_ready("tensorrt_llm"):
            assert time.monotonic() < deadline, "the model still reports ready with a dead engine worker"
            time.sleep(0.1)
        client.close()
    finally:
        server.stop()


def test_serve_instances_2_shares_one_worker_and_a_stop_with_streams_on_both_ends_cleanly(tmp_path, busy_core):
    server = start_server(tmp_path, executor="transformers", parameters={"max_batch_size": "4", "engine_process": "true"},
                          serve_args=["--instances", "2"], new_session=True)
    try:
        (worker,) = engine_workers(server)
        processes = psutil.Process(server.process.pid).children(recursive=True)
        assert "2 instance(s) of tensorrt_llm" in server.log()
        assert len(re.findall(r"stub \d \(pid \d+\) attached", server.log())) == 2, server.log()[-3000:]
        result = stream_once(server.grpc_url, "tensorrt_llm", token_inputs(PROMPTS[0], 4), timeout_s=120)
        assert result.errors == [] and len(result.tokens()) == 4

        # Ctrl-C with streams open on both instances, a core kept busy beside: each stream ends with one final, both
        # stubs leave the worker (a bye's answer read by a poll already under way was once lost, and that stub waited
        # 30 s), and the server exits 0 within Triton's exit timeout, which it spends on the instances one after
        # another (each instance releases its executor when it sees the unload, not when Triton finalizes it).
        client = StreamClient(server.grpc_url)
        streams = []
        while not all(per_instance(server, "nv_llm_open_requests").get(name, 0) > 0 for name in INSTANCES):
            assert len(streams) < 4, per_instance(server, "nv_llm_open_requests")
            streams.append(client.send("tensorrt_llm", token_inputs([1, 504, 3575 + len(streams)], 4000,
                                                                    min_tokens=(4000, np.int32)), f"t{len(streams)}"))
            time.sleep(0.5)
        wait_until_streaming(streams, 60)
        server.process.send_signal(signal.SIGINT)
        for stream in streams:
            assert stream.done.wait(20), f"a stream got no final response:\n{server.log()[-3000:]}"
            assert stream.finals == 1 and all(e.startswith("UNAVAILABLE: ") for e in stream.errors), stream.errors
        client.close()
        assert server.process.wait(30) == 0, server.log()[-3000:]
        assert "Exit timeout expired" not in server.log()
        assert len(re.findall(r"stub \d left; [01] attached", server.log())) == 2, server.log()[-3000:]
    finally:
        server.stop()
    assert [p.pid for p in processes if not exited(p.pid, 10)] == [], "a process outlived the server"


def test_tritonserver_killed_with_streams_on_two_instances_leaves_no_stub_nor_worker_behind(tmp_path):
    """However tritonserver ends, what it started ends with it. Killed with streams open on two instances sharing a
    worker, one stub and the worker once stayed alive (the stub ignores SIGTERM), the worker decoding on."""
    server = start_server(tmp_path, executor="transformers", parameters={"max_batch_size": "4", "engine_process": "true"},
                          serve_args=["--instances", "2"], new_session=True)
    try:
        (worker,) = engine_workers(server)
        (tritonserver,) = psutil.Process(server.process.pid).children()
        processes = tritonserver.children(recursive=True)
        assert worker in processes and len(processes) == 3, processes  # two stubs and the worker
        client = StreamClient(server.grpc_url)
        streams = [client.send("tensorrt_llm", token_inputs([1, 504, 3575 + i], 4000, min_tokens=(4000, np.int32)),
                               f"t{i}") for i in range(4)]
        wait_until_streaming(streams, 120)
        tritonserver.kill()
        assert server.process.wait(30) != 0
        alive = [p.pid for p in processes if not exited(p.pid, 10)]
        assert alive == [], f"outlived tritonserver: {alive}\n{server.log()[-3000:]}"
        client.close()
    finally:
        server.stop()
