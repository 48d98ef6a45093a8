"""Starting and stopping the server: a clean stop, a clear error for a port in use."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from conftest import start_server
from triton_client import stream_once, token_inputs

pytestmark = pytest.mark.e2e


def test_clean_stop_exits_zero_and_frees_the_ports(tmp_path):
    server = start_server(tmp_path, executor="synthetic")
    assert stream_once(server.grpc_url, "tensorrt_llm", token_inputs([3], 2)).errors == []
    assert server.stop() == 0
    for port in (server.http_port, server.grpc_port, server.metrics_port):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine; a listener is not
            sock.bind(("127.0.0.1", port))


def test_port_in_use_is_a_clear_error_not_a_hang(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        completed = subprocess.run(
            [sys.executable, "-m", "trtllm_model.launch.cli", "serve", f"--http-port={port}", "--grpc-port=0", "--metrics-port=0"],
            capture_output=True, text=True, timeout=30,
        )
    assert completed.returncode == 2
    assert f"port(s) {port} already in use" in completed.stderr


def test_unknown_config_parameter_fails_the_load_naming_it(tmp_path):
    server = start_server(tmp_path, parameters={"max_batch_sise": "8"}, expect_ready=False)
    assert server.process.wait(120) != 0
    assert "max_batch_sise" in server.log()
