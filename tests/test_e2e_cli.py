"""`trtllm-triton` as a user meets it: `--version`, `serve --set KEY=VALUE` reaching the model that serves, and a
first screen on a CPU host without tritonserver's CUDA, NVML, DCGM and pinned-memory complaints."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from triton_client import as_inputs

from trtllm_model.cli import package_version
from trtllm_model.server import cuda_driver_present

pytestmark = pytest.mark.e2e


def test_version_names_the_installed_package():
    result = subprocess.run([sys.executable, "-m", "trtllm_model.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"trtllm-triton {package_version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version())


@pytest.mark.skipif(cuda_driver_present(), reason="the quiet start is for hosts without a CUDA driver")
def test_a_cpu_host_first_screen_has_no_error_lines(tmp_path):
    # The default repository's five models (the ensemble asks tritonserver for a CUDA copy stream) on this CPU host.
    server = start_server(tmp_path, models=("tensorrt_llm", "ensemble", "preprocessing", "postprocessing",
                                            "tensorrt_llm_bls"))
    try:
        screen = server.log().split("trtllm-triton: ready")[0]
    finally:
        server.stop()
    assert "Started GRPCInferenceService" in screen
    noisy = [line for line in screen.splitlines() if not line.startswith("trtllm-triton:") and (
             re.match(r"[EW]\d{4} ", line) or "Error" in line or "error:" in line
             or re.search("NVML|DCGM|CudaDriverHelper|pinned memory|CUDA driver", line))]
    assert noisy == []
    assert "no CUDA driver on this host" in screen  # the one line that says why


def test_serve_set_reaches_the_model_and_a_bad_key_fails_its_load(tmp_path):
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
    bad = start_server(tmp_path / "bad", serve_args=["--set", "no_such_setting=1"], expect_ready=False)
    deadline = time.monotonic() + 120
    while bad.process.poll() is None and "no_such_setting" not in bad.log() and time.monotonic() < deadline:
        time.sleep(0.5)
    bad.stop()
    assert "no_such_setting" in bad.log()
