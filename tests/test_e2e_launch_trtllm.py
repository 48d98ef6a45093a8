"""deploy/launch_trtllm.sh against a real tritonserver: nvidia-pytriton's, standing in for the one in NVIDIA's
container, serving trtllm_engine over the fake tensorrt_llm (tests/fakes) and a fake engine directory.

The launcher puts tritonserver's HTTP and metrics listeners on loopback ports and the HTTP guard
(`python -m trtllm_model.launch.http_guard`) on the public ones, as `trtllm-triton serve` does: the requests that end
tritonserver 2.51 (a 5 MB form body, JSON nested 300,000 deep) are refused there and it serves on; a SIGTERM to the
launcher ends tritonserver, its stubs and the guard, and no process it started is left."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_launch_trtllm import ROOT, SCRIPT
from trtllm_support import FAKES_DIR, make_engine_dir

from trtllm_model.launch.http_guard import MAX_BODY_BYTES, MAX_JSON_DEPTH
from trtllm_model.server import (
    CPU_HOST_ARGS,
    backend_directory,
    cuda_driver_present,
    free_ports,
    pytriton_dir,
    server_environment,
)

pytestmark = pytest.mark.e2e

FORM = "application/x-www-form-urlencoded"  # what `curl -d` sends: libevhtp decodes it on a thread's stack
SMALL_GENERATE = json.dumps({"input_ids": [1, 2, 3], "request_output_len": 2}).encode()


@dataclass
class Launched:
    process: subprocess.Popen  # bash running the launcher, leader of its own session
    http_port: int
    metrics_port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def send(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def session_processes(session: int) -> dict[int, str]:
    """pid -> command line of every live (not zombie) process in `session`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return found


def start_launcher(workdir: Path) -> Launched:
    """The launcher as the container runs it, with `tritonserver` on PATH being pytriton's (plus what this host
    needs: the backend directory, and no pinned memory without a CUDA driver)."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(parents=True)
    host_args = " ".join(("--model-load-thread-count=1", *(() if cuda_driver_present() else CPU_HOST_ARGS)))
    (bin_dir / "tritonserver").write_text(
        f'#!/bin/sh\nexec {pytriton_dir() / "bin" / "tritonserver"} --backend-directory={backend_directory()} '
        f'{host_args} "$@"\n')
    (bin_dir / "tritonserver").chmod(0o755)
    http_port, grpc_port, metrics_port = free_ports(3)
    environment = server_environment({
        "PATH": f"{bin_dir}:{server_environment()['PATH']}", "PYTHON": sys.executable, "PTH_DIR": str(workdir),
        "TRTLLM_TRITON_ROOT": str(ROOT), "MODEL_REPOSITORY": str(workdir / "repository"),
        "ENGINE_DIR": str(make_engine_dir(workdir / "engine", max_batch_size=64)),
        "HTTP_PORT": str(http_port), "GRPC_PORT": str(grpc_port), "METRICS_PORT": str(metrics_port),
        "EXIT_TIMEOUT_SECS": "10", "OPENAI_PORT": "",
        # The stub puts PYTHONPATH's entries on its path (trtllm_model/__init__.py): the fake tensorrt_llm.
        "PYTHONPATH": os.pathsep.join([str(FAKES_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    })
    log_path = workdir / "launcher.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(["bash", str(SCRIPT)], env=environment, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    launched = Launched(process, http_port, metrics_port, log_path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the launcher exited ({process.returncode}):\n{launched.log()[-4000:]}"
        with contextlib.suppress(OSError):
            if send(http_port, "GET", "/v2/models/tensorrt_llm/ready")[0] == 200:
                return launched
        time.sleep(0.5)
    raise AssertionError(f"not ready after 300 s:\n{launched.log()[-4000:]}")


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Iterator[Launched]:
    launched = start_launcher(tmp_path_factory.mktemp("launch_trtllm"))
    try:
        yield launched
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launched.process.pid, signal.SIGKILL)
        launched.process.wait()


def assert_serving(launched: Launched, what: str) -> None:
    """tritonserver is up and answers a small generate through the guard at once."""
    started = time.monotonic()
    status, reply = send(launched.http_port, "POST", "/v2/models/tensorrt_llm/generate", SMALL_GENERATE)
    assert status == 200 and json.loads(reply)["output_ids"], (what, status, reply, launched.log()[-3000:])
    assert time.monotonic() - started < 30, f"a small generate took {time.monotonic() - started:.1f} s after {what}"


def test_tritonserver_listens_on_loopback_behind_the_guard_on_the_public_ports(launched):
    processes = session_processes(launched.process.pid).values()
    (server,) = [line for line in processes if "/tritonserver " in line and "--model-repository=" in line]
    flags = dict(arg.split("=", 1) for arg in server.split() if arg.startswith("--") and "=" in arg)
    assert flags["--http-address"] == flags["--metrics-address"] == "127.0.0.1"
    assert {int(flags["--http-port"]), int(flags["--metrics-port"])}.isdisjoint({launched.http_port,
                                                                                  launched.metrics_port})
    (guard,) = [line for line in processes if "trtllm_model.launch.http_guard" in line]
    assert f"--route={launched.http_port}={flags['--http-port']}" in guard
    assert f"--route={launched.metrics_port}={flags['--metrics-port']}" in guard
    status, metrics = send(launched.metrics_port, "GET", "/metrics")
    assert status == 200 and "nv_inference_request_success" in metrics
    assert_serving(launched, "the start")


def test_a_5_mb_form_body_and_deep_json_are_refused_and_tritonserver_serves_on(launched):
    """Without the guard either request ends tritonserver 2.51 (SIGSEGV; docs/reliability.md)."""
    body = json.dumps({"input_ids": [1] * 10, "text_input": "word " * 1_000_000, "request_output_len": 4}).encode()
    for path in ("/v2/models/tensorrt_llm/generate", "/v2/models/ensemble/generate", "/v2/models/ensemble/infer"):
        status, reply = send(launched.http_port, "POST", path, body, {"Content-Type": FORM})
        assert status == 413, (path, status, reply)
        assert json.loads(reply)["error"] == (f"request body of {len(body)} bytes is over this server's "
                                              f"{MAX_BODY_BYTES} (HTTP); send larger requests over gRPC")
        assert_serving(launched, f"5 MB to {path}")
    status, reply = send(launched.metrics_port, "POST", "/metrics", body, {"Content-Type": FORM})
    assert status == 413, (status, reply)
    for deep in (b"[" * 300_000, b'{"input_ids": ' + b'{"a": ' * 250_000 + b"1" + b"}" * 250_001):
        status, reply = send(launched.http_port, "POST", "/v2/models/tensorrt_llm/generate", deep,
                             {"Content-Type": "application/json"})
        assert status == 400, (status, reply)
        assert json.loads(reply)["error"] == f"the request's JSON nests deeper than {MAX_JSON_DEPTH} levels"
        assert_serving(launched, f"{len(deep)} bytes of nesting")


def test_sigterm_ends_tritonserver_its_stubs_and_the_guard_and_leaves_no_process(launched):
    session = launched.process.pid
    before = session_processes(session)
    assert any("triton_python_backend_stub" in line for line in before.values()), before
    launched.process.send_signal(signal.SIGTERM)
    assert launched.process.wait(60) == 0, launched.log()[-4000:]
    deadline = time.monotonic() + 10
    while session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_processes(session) == {}, launched.log()[-4000:]
    with pytest.raises(OSError):
        send(launched.http_port, "GET", "/v2/health/live")
