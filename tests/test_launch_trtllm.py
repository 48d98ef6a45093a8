"""deploy/launch_trtllm.sh: configures the repository, then runs one tritonserver or one per MPI rank, behind the
HTTP guard.

tritonserver and mpirun are stand-ins here that print their arguments, so the command lines are checked exactly; the
guard is the real one (tests/test_e2e_launch_trtllm.py runs the launcher against a real tritonserver).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtllm_model.server import ADMIN_HEADER, RESTRICTED_PROTOCOLS, free_ports

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy" / "launch_trtllm.sh"


def make_stand_ins(directory: Path) -> Path:
    """A bin directory whose tritonserver and mpirun print their arguments."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    for name in ("tritonserver", "mpirun"):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho {name} "$@"\n')
        stub.chmod(0o755)
    return bin_dir


@pytest.fixture
def stand_ins(tmp_path):
    return make_stand_ins(tmp_path)


def environment(tmp_path: Path, bin_dir: Path, **env: str) -> dict[str, str]:
    """The launcher's environment: the stand-ins first on PATH, its paths under tmp_path, and free public ports (the
    guard takes them for real)."""
    http_port, metrics_port = free_ports(2)
    return {
        **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable, "PTH_DIR": str(tmp_path),
        "TRTLLM_TRITON_ROOT": str(ROOT), "MODEL_REPOSITORY": str(tmp_path / "repo"), "HTTP_PORT": str(http_port),
        "METRICS_PORT": str(metrics_port), **env,
    }


def launch(tmp_path: Path, bin_dir: Path, command: list[str] | None = None, **env: str) -> subprocess.CompletedProcess:
    """SCRIPT (or `command`) with the stand-ins first on PATH and its paths moved under tmp_path."""
    return subprocess.run(command or ["bash", str(SCRIPT)], env=environment(tmp_path, bin_dir, **env),
                          capture_output=True, text=True, timeout=60)


def test_single_engine_server_gets_a_configured_repository(tmp_path, stand_ins):
    done = launch(tmp_path, stand_ins, ENGINE_DIR="/engines/llama", CONFIGURE_SETS="max_beam_width=2")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "trtllm_triton.pth").read_text().strip() == str(ROOT)
    config = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'string_value: "/engines/llama"' in config and 'string_value: "2"' in config
    command = done.stdout.strip().splitlines()[-1].split()
    assert command[0] == "tritonserver" and f"--model-repository={tmp_path / 'repo'}" in command
    assert "--grpc-port=8001" in command and "--load-model=*" in command
    # HTTP and metrics on loopback ports: the guard takes 8000 and 8002.
    assert "--http-address=127.0.0.1" in command and "--metrics-address=127.0.0.1" in command
    ports = dict(arg.split("=", 1) for arg in command if arg.startswith(("--http-port=", "--metrics-port=")))
    assert ports["--http-port"] not in ("8000", "8002") and ports["--metrics-port"] not in ("8000", "8002")


def test_world_size_two_runs_one_server_per_rank_and_only_rank_0_serves(tmp_path, stand_ins):
    done = launch(tmp_path, stand_ins, WORLD_SIZE="2")
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip().splitlines()[-1]
    assert command.startswith("mpirun --allow-run-as-root -n 1 tritonserver")
    rank0, rank1 = command.split(" : ")
    assert "--grpc-port=8001" in rank0 and "shm-region-prefix-name=rank0_" in rank0
    assert "--http-address=127.0.0.1" in rank0 and "--metrics-address=127.0.0.1" in rank0
    assert "--allow-grpc=false" in rank1 and "--load-model=tensorrt_llm" in rank1 and "rank1_" in rank1


def test_orchestrator_mode_is_a_single_server(tmp_path, stand_ins):
    done = launch(tmp_path, stand_ins, WORLD_SIZE="4", TRTLLM_ORCHESTRATOR="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("tritonserver ")
    config = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "trtllmExecutorWorker" in config


def test_llmapi_and_a_bad_setting(tmp_path, stand_ins):
    done = launch(tmp_path, stand_ins, TRTLLM_EXECUTOR="trtllm_llmapi", CHECKPOINT_DIR="/checkpoint/qwen")
    assert done.returncode == 0, done.stderr
    assert 'string_value: "/checkpoint/qwen"' in (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    failed = launch(tmp_path, stand_ins, CONFIGURE_SETS="gpt_model_pth=/x")
    assert failed.returncode != 0 and "unknown key" in failed.stderr and "tritonserver" not in failed.stdout


def test_exit_timeout_multinode_hosts_and_configure_only(tmp_path, stand_ins):
    done = launch(tmp_path, stand_ins, WORLD_SIZE="2", EXIT_TIMEOUT_SECS="45", MPI_HOSTS="leader:1,worker-1:1")
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip().splitlines()[-1]
    assert command.startswith("mpirun --allow-run-as-root --host leader:1,worker-1:1 -n 1 tritonserver")
    assert "--exit-timeout-secs=45" in command.split(" : ")[0]
    single = launch(tmp_path, stand_ins)
    assert "--exit-timeout-secs=30" in single.stdout.strip().splitlines()[-1].split()
    only = launch(tmp_path, stand_ins, CONFIGURE_ONLY="1", MODEL_REPOSITORY=str(tmp_path / "worker-repo"))
    assert only.returncode == 0 and "tritonserver" not in only.stdout and "mpirun" not in only.stdout
    assert (tmp_path / "worker-repo" / "tensorrt_llm" / "config.pbtxt").exists()


def restriction_keys(command: str) -> set[str]:
    """The admin keys in a command line's --http-restricted-api and --grpc-restricted-protocol flags (asserted there)."""
    protocols = ",".join(RESTRICTED_PROTOCOLS)
    http = re.findall(rf"--http-restricted-api={protocols}:{ADMIN_HEADER}=(\S+)", command)
    grpc = re.findall(rf"--grpc-restricted-protocol={protocols}:{ADMIN_HEADER}=(\S+)", command)
    assert len(http) == 1 and http == grpc, command
    return set(http)


def test_the_model_repository_api_is_restricted_to_a_key_made_per_start_or_given(tmp_path, stand_ins):
    """Without the flags anyone reaching port 8000/8001 could upload a model (Python code) and run it."""
    first, second = (launch(tmp_path, stand_ins) for _ in range(2))
    keys = [restriction_keys(done.stdout.strip().splitlines()[-1]) for done in (first, second)]
    assert keys[0] != keys[1] and all(len(key.pop()) >= 32 for key in keys)
    given = launch(tmp_path, stand_ins, TRTLLM_TRITON_ADMIN_KEY="operator-key-0123456789")
    assert restriction_keys(given.stdout.strip().splitlines()[-1]) == {"operator-key-0123456789"}
    # Leader mode: rank 0 serves and is restricted; the other ranks open no endpoint at all.
    rank0, rank1 = launch(tmp_path, stand_ins, WORLD_SIZE="2").stdout.strip().splitlines()[-1].split(" : ")
    assert len(restriction_keys(rank0)) == 1 and "--allow-http=false" in rank1 and "--allow-grpc=false" in rank1


def test_an_unusable_operator_key_stops_the_start(tmp_path, stand_ins):
    failed = launch(tmp_path, stand_ins, TRTLLM_TRITON_ADMIN_KEY="short:key")
    assert failed.returncode != 0 and "TRTLLM_TRITON_ADMIN_KEY must be" in failed.stderr
    assert "tritonserver" not in failed.stdout


@pytest.mark.parametrize("server_name", ["tritonserver", "mpirun"])
def test_a_server_that_ignores_the_stop_is_killed_after_its_exit_timeout(tmp_path, server_name):
    # tritonserver 2.51 never exits after SIGTERM while a client's gRPC stream is open (issue 31 item 13): the script
    # passes the stop on, then kills the server (or mpirun, WORLD_SIZE > 1) and its children EXIT_TIMEOUT_SECS + 5 s
    # later; then the guard goes too.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pids = tmp_path / "pids"
    (bin_dir / server_name).write_text(
        f"#!/bin/bash\ntrap 'echo got-term >> {tmp_path}/log' TERM\nsleep 300 &\n"
        f"echo \"$$ $!\" > {pids}\nwhile true; do wait; done\n")
    (bin_dir / server_name).chmod(0o755)
    env = environment(tmp_path, bin_dir, EXIT_TIMEOUT_SECS="1", WORLD_SIZE="2" if server_name == "mpirun" else "1")
    script = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or not pids.read_text().strip():
            assert time.monotonic() < deadline and script.poll() is None, "the server never started"
            time.sleep(0.1)
        server, child = (int(pid) for pid in pids.read_text().split())
        started = time.monotonic()
        script.send_signal(signal.SIGTERM)
        script.wait(timeout=30)
        took = time.monotonic() - started
        assert 5.5 < took < 15, took  # 1 s exit timeout + 5 s
        assert (tmp_path / "log").read_text().strip() == "got-term"  # the stop reached it first
        for pid in (server, child):
            deadline = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(pid), pid
        assert_session_ends(script.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)


def assert_session_ends(session: int, timeout_s: float = 10.0) -> None:
    """No process of `session` (the launcher's: every process it started) outlives it for long."""
    deadline = time.monotonic() + timeout_s
    while (left := _session_members(session)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def sleeping_server(tmp_path: Path) -> Path:
    """A bin directory whose tritonserver waits until it is stopped."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tritonserver").write_text("#!/bin/sh\nexec sleep 600\n")
    (bin_dir / "tritonserver").chmod(0o755)
    return bin_dir


def _guard_pid(session: int, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in _session_members(session):
            with contextlib.suppress(OSError):
                if b"trtllm_model.launch.http_guard" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
        time.sleep(0.1)
    raise AssertionError("no guard started")


def _listens(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
        return True
    return False


def test_a_guard_that_ends_while_serving_stops_tritonserver_and_the_launcher_exits_1(tmp_path):
    """With no door on the public ports the container must end, so that its orchestrator starts it again."""
    env = environment(tmp_path, sleeping_server(tmp_path), ENGINE_DIR="/engines/llama")
    script = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        guard = _guard_pid(script.pid)
        deadline = time.monotonic() + 60
        while not _listens(int(env["HTTP_PORT"])):
            assert time.monotonic() < deadline and script.poll() is None, "the guard never listened"
            time.sleep(0.1)
        os.kill(guard, signal.SIGKILL)
        assert script.wait(30) == 1
        assert "the HTTP guard exited (137) while serving; stopping tritonserver" in script.stderr.read()
        assert_session_ends(script.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)


def test_a_public_port_in_use_fails_the_start(tmp_path):
    with socket.create_server(("0.0.0.0", 0)) as taken:
        env = environment(tmp_path, sleeping_server(tmp_path), ENGINE_DIR="/engines/llama",
                          HTTP_PORT=str(taken.getsockname()[1]))
        script = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        try:
            assert script.wait(60) == 1
            assert "http_guard: cannot listen on 0.0.0.0" in script.stderr.read()
            assert_session_ends(script.pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(script.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child not yet reaped by its (gone) parent is a zombie: dead for this purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][0] != "Z"


def test_openai_port_starts_the_openai_api_next_to_tritonserver_and_stops_it_with_it(tmp_path):
    """With OPENAI_PORT the launcher runs `trtllm-triton openai` on it (answering /health: 503 while no Triton
    answers), and a stop of the launcher stops it too."""
    import requests

    (port,) = free_ports(1)
    env = environment(tmp_path, sleeping_server(tmp_path), OPENAI_PORT=str(port), ENGINE_DIR="/engines/llama", EXIT_TIMEOUT_SECS="1")
    launcher = subprocess.Popen(["bash", str(SCRIPT)], env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        status = None
        while status is None and time.monotonic() < deadline and launcher.poll() is None:
            try:
                status = requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
            except requests.ConnectionError:
                time.sleep(0.5)
        assert status == 503, launcher.stdout.read() if launcher.poll() is not None else status
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) is not None
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
        assert_session_ends(launcher.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
