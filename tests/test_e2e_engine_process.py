"""End to end: the transformers executor's engine in its worker process (`engine_process`, the default on CUDA), behind a
real tritonserver. A SIGKILL of the worker mid-stream takes the executor-death path: every open stream, token- and
text-level, ends with one UNAVAILABLE final and the model reports not ready; so does a SIGSTOP once the worker's
heartbeat is missed for engine_heartbeat_timeout_s; the worker never outlives the server."""

from __future__ import annotations

import re
import signal
import time

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from triton_client import StreamClient, model_error, stream_once, text_inputs, token_inputs, wait_until_streaming

pytestmark = pytest.mark.e2e

WORKER_MODULE = "trtllm_model.executors.engine_worker"


def engine_workers(server) -> list[psutil.Process]:
    return [process for process in psutil.Process(server.process.pid).children(recursive=True)
            if WORKER_MODULE in " ".join(process.cmdline())]


def signal_once_streaming(worker: psutil.Process, streams: list, signum: int, within_s: float, *reasons: str) -> float:
    """Send the worker `signum` once every stream has a response: each stream ends within `within_s` with exactly one
    final, an UNAVAILABLE error naming every one of `reasons`; when the signal went."""
    wait_until_streaming(streams, 120)
    worker.send_signal(signum)
    signalled_at = time.monotonic()
    for stream in streams:
        assert stream.done.wait(max(0.0, signalled_at + within_s - time.monotonic())), "a stream was left hanging"
        assert stream.finals == 1 and len(stream.errors) == 1, stream.errors
        assert model_error(stream.errors[0]).startswith("UNAVAILABLE"), stream.errors
        assert all(reason in stream.errors[0] for reason in reasons), stream.errors
    return signalled_at


def test_killing_the_engine_worker_mid_stream_ends_every_stream_unavailable_and_the_model_not_ready(tmp_path):
    server = start_server(tmp_path, executor="transformers", parameters={"max_batch_size": "4", "engine_process": "true"})
    try:
        (worker,) = engine_workers(server)
        client = StreamClient(server.grpc_url)
        streams = [
            client.send("tensorrt_llm", token_inputs([1, 504, 3575 + i], 4000, min_tokens=(4000, np.int32)), f"t{i}")
            for i in range(2)
        ]
        streams.append(client.send("ensemble", text_inputs("Tell me a long story.", 4000,
                                                           min_tokens=(4000, np.int32)), "text"))
        signal_once_streaming(worker, streams, signal.SIGKILL, 5.0, "executor failed",
                              "engine worker exited (killed by SIGKILL)")
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + 10
        while grpc_client.is_model_ready("tensorrt_llm") or grpc_client.is_model_ready("ensemble"):
            assert time.monotonic() < deadline, "a model still reports ready with a dead engine worker"
            time.sleep(0.1)
        late = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 504], 3))
        assert late.errors and ("UNAVAILABLE" in late.errors[0] or "no available versions" in late.errors[0])
        client.close()
    finally:
        server.stop()


def test_a_stopped_engine_worker_is_noticed_by_its_heartbeat_every_stream_ends_unavailable_and_the_model_not_ready(
    tmp_path,
):
    """SIGSTOP: the worker neither exits nor sends anything. With engine_heartbeat_timeout_s=3 the open streams end
    with UNAVAILABLE naming the hang within the timeout (plus the poller's look), and the model reports not ready."""
    server = start_server(tmp_path, executor="transformers",
                          parameters={"max_batch_size": "4", "engine_process": "true", "engine_heartbeat_timeout_s": "3"})
    (worker,) = engine_workers(server)
    try:
        client = StreamClient(server.grpc_url)
        streams = [client.send("tensorrt_llm", token_inputs([1, 504, 3575], 4000, min_tokens=(4000, np.int32)), "t"),
                   client.send("ensemble", text_inputs("Tell me a long story.", 4000, min_tokens=(4000, np.int32)),
                               "text")]
        stopped_at = signal_once_streaming(worker, streams, signal.SIGSTOP, 6.0, "(engine_heartbeat_timeout_s=3)")
        for stream in streams:
            # Which the stub notices first: silence, or (an iteration outlasting the last heartbeat) no progress.
            assert re.search(r"engine worker hung: no (heartbeat|engine iteration) for 3\.\d s", stream.errors[0])
        assert time.monotonic() - stopped_at >= 2.0  # not before the timeout (from the last heartbeat, <= 1 s earlier)
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + 10
        while grpc_client.is_model_ready("tensorrt_llm") or grpc_client.is_model_ready("ensemble"):
            assert time.monotonic() < deadline, "a model still reports ready with a hung engine worker"
            time.sleep(0.1)
        client.close()
    finally:
        if worker.is_running():
            worker.send_signal(signal.SIGCONT)
        server.stop()
    worker.wait(10)  # the hung worker was killed with its model, not left stopped


def test_the_worker_serves_and_ends_with_the_server(tmp_path):
    server = start_server(tmp_path, executor="transformers", parameters={"max_batch_size": "2", "engine_process": "true"})
    try:
        (worker,) = engine_workers(server)
        result = stream_once(server.grpc_url, "ensemble", text_inputs("What is the capital of France?", 16,
                                                                      apply_chat_template=(True, np.bool_)),
                             timeout_s=120)
        assert result.errors == [] and result.finals == 1 and "Paris" in result.text()
    finally:
        server.stop()
    worker.wait(10)  # raises psutil.TimeoutExpired while the worker outlives the server
