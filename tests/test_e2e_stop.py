"""A stop is clean and quick however it is signalled: Ctrl-C or SIGTERM to the process group (terminal, systemd),
SIGTERM to `trtllm-triton` only (docker stop, Kubernetes), SIGTERM to tritonserver only.

Each way is tried idle and with 20 streams open on both models (synthetic executor with slow steps, so that
every stream is still running when the signal comes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import numpy as np
import psutil
import pytest
from conftest import start_server
from triton_client import StreamClient, model_error, text_inputs, token_inputs, wait_until_streaming

pytestmark = pytest.mark.e2e

STREAMS = 20
GONE_WITHIN_S = 10.0

WAYS = {
    "ctrl-c to the group": lambda server: os.killpg(server.process.pid, signal.SIGINT),
    "sigterm to the group": lambda server: os.killpg(server.process.pid, signal.SIGTERM),
    "sigterm to trtllm-triton": lambda server: os.kill(server.process.pid, signal.SIGTERM),
    "sigterm to tritonserver": lambda server: os.kill(_tritonserver_pid(server), signal.SIGTERM),
}


def _tritonserver_pid(server) -> int:
    return int(subprocess.check_output(["pgrep", "-P", str(server.process.pid), "-f", "bin/tritonserver"]).split()[0])


def _tree_pids(pid: int) -> list[int]:
    """`pid` and its descendants (tritonserver and its stubs run in a process group of their own)."""
    root = psutil.Process(pid)
    return [pid, *(child.pid for child in root.children(recursive=True))]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _open_streams(server) -> tuple[StreamClient, list]:
    """STREAMS endless requests, half on `tensorrt_llm` and half on `ensemble`, each past its first token."""
    client = StreamClient(server.grpc_url)
    results = []
    for i in range(STREAMS):
        if i % 2:
            results.append(client.send("ensemble", text_inputs(f"story {i}", 4000), f"ensemble-{i}"))
        else:
            results.append(client.send("tensorrt_llm", token_inputs([i + 1], 4000), f"tensorrt_llm-{i}"))
    wait_until_streaming(results, 30)
    return client, results


# A stop that tritonserver starts by itself (the signal reached it, not `trtllm-triton`) used to lose a Python
# backend stub under load: gdb showed it segfaulting inside pb_utils.is_model_ready while the server stopped (3 runs
# in 10 on the 2-core machine with two busy loops beside it). The models now ask the HTTP endpoint instead (0 in 22).
# The rerun stays as a guard for a crash site that lies in Triton (docs/reliability.md, "Stopping").
SELF_STOPPED = pytest.mark.flaky(reruns=2)


# Every way of stopping with streams open; idle (the same checks with no stream) once, the way systemd and the
# kubelet stop it: an idle stop per way repeated the stream case's checks at a server start each.
@pytest.mark.parametrize(("way", "with_streams"), [
    *[pytest.param(way, True, id=f"{way}-{STREAMS}-streams", marks=SELF_STOPPED if way == "sigterm to tritonserver" else ())
      for way in WAYS],
    pytest.param("sigterm to trtllm-triton", False, id="sigterm to trtllm-triton-idle"),
])
def test_a_stop_ends_every_stream_and_the_process_tree_within_10_s(tmp_path, way, with_streams):
    server = start_server(tmp_path, parameters={"synthetic_step_ms": "200", "max_batch_size": "64"}, new_session=True)
    pgid = server.process.pid
    tree: list[int] = []
    try:
        client, results = _open_streams(server) if with_streams else (None, [])
        tree = _tree_pids(pgid)
        assert len(tree) >= 3, f"expected trtllm-triton, tritonserver and tensorrt_llm's stub: {tree}"
        started = time.monotonic()
        WAYS[way](server)
        for result in results:
            assert result.done.wait(GONE_WITHIN_S), f"a stream got no final response:\n{server.log()[-3000:]}"
        if client is not None:
            client.close()  # a client done with its requests closes its stream
        server.process.wait(GONE_WITHIN_S)
        while any(_alive(pid) for pid in tree):
            assert time.monotonic() - started < GONE_WITHIN_S, f"still running: {[p for p in tree if _alive(p)]}"
            time.sleep(0.1)
        elapsed = time.monotonic() - started
    finally:
        left = [pid for pid in tree if _alive(pid)]
        if server.process.poll() is None or left:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            server.process.wait()
    log = server.log()
    assert elapsed < GONE_WITHIN_S
    assert server.process.returncode == 0, log[-3000:]
    assert "Exit timeout expired" not in log and "Non-graceful termination" not in log, log[-3000:]
    for result in results:
        assert result.finals == 1, (result.finals, result.errors)
        # Retryable: "model is shutting down", through the ensemble too.
        assert len(result.errors) == 1 and model_error(result.errors[0]).startswith("UNAVAILABLE: "), result.errors


def test_tritonserver_follows_a_trtllm_triton_killed_hard(tmp_path):
    """SIGKILL leaves `trtllm-triton` no time to stop anything: tritonserver (in its own process group, so that
    terminal signals reach it only through `trtllm-triton`) still goes, told by the kernel (PR_SET_PDEATHSIG)."""
    server = start_server(tmp_path, executor="synthetic", new_session=True)
    tree = _tree_pids(server.process.pid)
    tritonserver = _tritonserver_pid(server)
    assert os.getpgid(tritonserver) != os.getpgid(server.process.pid)
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in tree):
        if time.monotonic() > deadline:
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail(f"still running 30 s after trtllm-triton was killed: {[p for p in tree if _alive(p)]}")
        time.sleep(0.1)


# -- after cancellations with `stop` over the TensorRT-LLM LLM API (issue 31 item 13) ------------------------------------
@pytest.mark.parametrize("streams_left_open", [False, True], ids=["clients-closed", "clients-hold-streams"])
def test_a_stop_after_cancellations_over_the_llm_api_is_bounded(tmp_path, streams_left_open):
    """8 streams over executor=trtllm_llmapi (the strict fake) cancelled with NVIDIA's `stop`, then SIGTERM.

    With the clients' streams closed the server stops cleanly at once. A client that keeps a gRPC stream open which
    carried a request keeps tritonserver 2.51 from unloading the model (finalize is never called; the executor's own
    shutdown takes 0.01 s) and from exiting, even past its exit timeout: that was the "could not unload within 15 s"
    (bench/llmapi_stop_shutdown.py: 10 of 10 runs with the streams held). A stream the client cancels just as its last
    response is written does the same (Triton fixed that race in 25.04). Every instance marks that it answered
    everything and released, so `serve` ends tritonserver itself once only Triton holds the model: exit 0, well
    inside the exit timeout, either way."""
    from test_e2e_trtllm_fakes import FAKE_ENVIRONMENT, repository_with_fake
    from triton_client import tensor
    from trtllm_support import make_checkpoint_dir

    from trtllm_model.launch.cli import HELD_SETTLE_S, UNLOAD_SETTLE_S

    checkpoint = make_checkpoint_dir(tmp_path / "checkpoint")
    repository = repository_with_fake(tmp_path, {"executor": "trtllm_llmapi", "hf_model_path": str(checkpoint)},
                                      ("tensorrt_llm",))
    server = start_server(tmp_path, executor="trtllm_llmapi", env=FAKE_ENVIRONMENT, repository=repository,
                          new_session=True)
    client, stopper = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    tree = _tree_pids(server.process.pid)
    try:
        running = [client.send("tensorrt_llm", token_inputs([1000 + i], 4000), f"r{i}") for i in range(8)]
        wait_until_streaming(running, 30)
        stops = [stopper.send("tensorrt_llm", [*token_inputs([1], 1), tensor("stop", True, np.bool_)], f"r{i}")
                 for i in range(8)]
        for result in stops + running:
            assert result.done.wait(30) and result.finals == 1 and result.errors == [], result.errors
        if not streams_left_open:
            client.close()
            stopper.close()
        started = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        limit = UNLOAD_SETTLE_S + 2 * HELD_SETTLE_S + GONE_WITHIN_S if streams_left_open else GONE_WITHIN_S
        code = server.process.wait(limit)
        while any(_alive(pid) for pid in tree):
            assert time.monotonic() - started < limit, f"still running: {[p for p in tree if _alive(p)]}"
            time.sleep(0.1)
    finally:
        client.close()
        stopper.close()
        for pid in [pid for pid in tree if _alive(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    log = server.log()
    if streams_left_open:
        assert code == 0 and "ending tritonserver now" in log and "Exit timeout expired" not in log, log[-3000:]
    else:
        assert code == 0 and "Exit timeout expired" not in log, log[-3000:]
