"""deploy/launch_trtllm.sh: configures the repository, then runs one tritonserver or one per MPI rank.

tritonserver and mpirun are stand-ins here that print their arguments, so the command lines are checked exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy" / "launch_trtllm.sh"


@pytest.fixture
def stand_ins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("tritonserver", "mpirun"):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho {name} "$@"\n')
        stub.chmod(0o755)
    return bin_dir


def launch(tmp_path: Path, bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {
        **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable, "PTH_DIR": str(tmp_path),
        "TRTLLM_TRITON_ROOT": str(ROOT), "MODEL_REPOSITORY": str(tmp_path / "repo"), **env,
    }
    return subprocess.run(["bash", str(SCRIPT)], env=environment, capture_output=True, text=True, timeout=60)


def test_single_engine_server_gets_a_configured_repository(tmp_path, stand_ins):
    done = launch(tmp_path, stand_ins, ENGINE_DIR="/engines/llama", CONFIGURE_SETS="max_beam_width=2")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "trtllm_triton.pth").read_text().strip() == str(ROOT)
    config = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'string_value: "/engines/llama"' in config and 'string_value: "2"' in config
    command = done.stdout.strip().splitlines()[-1].split()
    assert command[0] == "tritonserver" and f"--model-repository={tmp_path / 'repo'}" in command
    assert "--http-port=8000" in command and "--load-model=*" in command


def test_world_size_two_runs_one_server_per_rank_and_only_rank_0_serves(tmp_path, stand_ins):
    done = launch(tmp_path, stand_ins, WORLD_SIZE="2")
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip().splitlines()[-1]
    assert command.startswith("mpirun --allow-run-as-root -n 1 tritonserver")
    rank0, rank1 = command.split(" : ")
    assert "--grpc-port=8001" in rank0 and "shm-region-prefix-name=rank0_" in rank0
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
