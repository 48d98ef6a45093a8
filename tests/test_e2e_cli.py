"""`trtllm-triton` as a user meets it: `--version`, `serve --set KEY=VALUE` reaching the model that serves, and a
first screen on a CPU host without tritonserver's CUDA, NVML, DCGM and pinned-memory complaints."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from conftest import start_server
from triton_client import as_inputs

from trtllm_model import package_version
from trtllm_model.server import cuda_driver_present

pytestmark = pytest.mark.e2e

# A response `requests` still holds keeps its connection open, and tritonserver's stop waits its whole exit timeout
# (15 s) for open HTTP connections: the one request closes its own.
ONE_SHOT = {"Connection": "close"}


def test_version_names_the_installed_package():
    result = subprocess.run([sys.executable, "-m", "trtllm_model.launch.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"trtllm-triton {package_version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version())


@pytest.mark.skipif(cuda_driver_present(), reason="the quiet start is for hosts without a CUDA driver")
def test_a_cpu_host_first_screen_has_no_error_lines_tables_or_first_request_warning(tmp_path):
    # The default repository's five models (the ensemble asks tritonserver for a CUDA copy stream) on this CPU host.
    server = start_server(tmp_path, models=("tensorrt_llm", "ensemble", "preprocessing", "postprocessing",
                                            "tensorrt_llm_bls"))
    try:
        answer = requests.post(f"{server.http_url}/v2/models/tensorrt_llm/generate", timeout=120, headers=ONE_SHOT,
                               json={"text_input": "What is the capital of France?", "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        log = server.log()
        screen = log.split("trtllm-triton: ready")[0]
    finally:
        server.stop()
    assert "Started GRPCInferenceService" in screen
    noisy = [line for line in log.splitlines() if not line.startswith("trtllm-triton:") and (
             re.match(r"[EW]\d{4} ", line) or "Error" in line or "error:" in line
             or re.search("NVML|DCGM|CudaDriverHelper|pinned memory|pinned system memory|CUDA driver|Loading weights", line))]
    assert noisy == []
    # tritonserver's start-up tables (backends, models, options; up to 230 characters wide): only with --verbose
    assert [line for line in screen.splitlines() if line.startswith(("+-", "| "))] == []
    assert "no CUDA driver on this host" in screen  # the one line that says why


def test_serve_set_reaches_the_model_and_a_bad_key_or_value_is_refused_before_the_start(tmp_path):
    server = start_server(tmp_path / "good", serve_args=["--set", "synthetic_vocab_size=7", "--set", "max_batch_size=4",
                                                       "--decoupled", "false"])
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        result = client.infer("tensorrt_llm", as_inputs({
            "input_ids": np.array([[1, 2, 3]], dtype=np.int32),
            "input_lengths": np.array([[3]], dtype=np.int32),
            "request_output_len": np.array([[40]], dtype=np.int32),
            "exclude_input_in_output": np.array([[True]]),
        }))
        tokens = result.as_numpy("output_ids").reshape(-1).tolist()
        assert len(tokens) == 40 and max(tokens) < 7  # the synthetic executor drew from the vocabulary it was given
        assert "max_batch_size=4" in server.log()  # serve says what it changed
    finally:
        server.stop()
    for assignment, message in (("no_such_setting=1", "unknown parameter(s) in config.pbtxt: no_such_setting"),
                                ("max_batch_size=x", "parameter max_batch_size='x': expected an integer")):
        refused = subprocess.run([sys.executable, "-m", "trtllm_model.launch.cli", "serve", "--set", assignment,
                                  "--no-openai"], capture_output=True, text=True, timeout=180)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.count(message) == 1, refused.stderr  # once, before anything started
        assert "Traceback" not in refused.stderr and "tritonserver" not in refused.stdout + refused.stderr


def test_serve_model_serves_a_checkpoint_directory_and_refuses_another_architecture_before_starting(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tiny_checkpoint import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "tiny", layers=2, hidden=64)
    server = start_server(tmp_path / "served", executor=None, serve_args=["--model", str(checkpoint)])
    try:
        answer = requests.post(f"{server.http_url}/v2/models/tensorrt_llm/generate", timeout=120, headers=ONE_SHOT,
                               json={"text_input": "What is the capital of France?", "max_tokens": 6, "min_tokens": 6})
        assert answer.status_code == 200 and answer.json()["text_output"]  # random weights: some words
        assert f"model_dir={checkpoint}" in server.log()  # serve says what it serves
    finally:
        server.stop()

    other = tmp_path / "mixtral"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    refused = subprocess.run([sys.executable, "-m", "trtllm_model.launch.cli", "serve", "--model", str(other), "--no-openai"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.count("architecture MixtralForCausalLM is not one the embedded engine runs") == 1
    assert "Traceback" not in refused.stderr and "tritonserver" not in refused.stdout + refused.stderr
