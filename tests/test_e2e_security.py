"""Triton's model-repository API is closed to clients without the admin key (docs/security.md).

The server is started as `make serve` starts it (`trtllm-triton serve`, no key given: it generates one), with the
synthetic executor. The attack is the one Triton's documentation describes for the load API: a load request whose
parameters carry a `config` and a `file:1/model.py`; that model.py writes a marker file when it is imported. Before
`serve` restricted the API, both the HTTP and the gRPC load answered OK and the marker appeared.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import Server, start_server
from triton_client import stream_once, token_inputs
from tritonclient.utils import InferenceServerException

from trtllm_model.executors.synthetic import synthetic_token
from trtllm_model.server import ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_ADMIN_PREFIX, RESTRICTED_PROTOCOLS, admin_headers

pytestmark = pytest.mark.e2e

EVIL_CONFIG = {
    "name": "evil",
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
}


def evil_model_py(marker: Path) -> bytes:
    return (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
            "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n").encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # An empty key: `serve` generates its own, as it does for `make serve`.
    server = start_server(tmp_path_factory.mktemp("security"), env={ADMIN_KEY_ENV: ""})
    yield server
    server.stop()


def http_post(server: Server, path: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"{server.http_url}{path}", json.dumps(body).encode(), headers or {},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def generated_key(server: Server) -> str:
    """The key `serve` generated, read from tritonserver's command line (what a user of this host could read)."""
    tritonserver = next(p for p in psutil.Process(server.process.pid).children() if "tritonserver" in p.name())
    flags = [arg for arg in tritonserver.cmdline() if arg.startswith("--http-restricted-api=")]
    assert len(flags) == 1, tritonserver.cmdline()
    protocols = ",".join(RESTRICTED_PROTOCOLS)
    match = re.fullmatch(rf"--http-restricted-api={protocols}:{ADMIN_HEADER}=(\S+)", flags[0])
    assert match, flags[0]
    return match.group(1)


def still_served(server: Server) -> None:
    assert http_status(f"{server.http_url}/v2/models/tensorrt_llm/ready") == 200
    assert stream_once(server.grpc_url, "tensorrt_llm", token_inputs([5], 3)).tokens() == [
        synthetic_token([5], i, 32000) for i in range(3)]


@pytest.mark.parametrize("headers", [None, admin_headers("not-the-key-0123456789")], ids=["no key", "wrong key"])
def test_http_client_cannot_load_code_or_unload_the_model(server, tmp_path, headers):
    marker = tmp_path / "evil-ran"
    parameters = {"config": json.dumps(EVIL_CONFIG),
                  "file:1/model.py": base64.b64encode(evil_model_py(marker)).decode()}
    code, body = http_post(server, "/v2/repository/models/evil/load", {"parameters": parameters}, headers)
    assert code == 403 and f"expecting header '{ADMIN_HEADER}'" in body, (code, body)
    code, body = http_post(server, "/v2/repository/models/tensorrt_llm/unload", {}, headers)
    assert code == 403, (code, body)
    code, _ = http_post(server, "/v2/repository/index", {}, headers)
    assert code == 403
    time.sleep(1.0)  # a load that got through would have started the stub by now
    assert not marker.exists()
    assert http_status(f"{server.http_url}/v2/models/evil/ready") == 400
    still_served(server)


def test_grpc_client_cannot_load_code_or_unload_the_model(server, tmp_path):
    marker = tmp_path / "evil-ran"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match=f"expecting header '{GRPC_ADMIN_PREFIX}{ADMIN_HEADER}'"):
            client.load_model("evil", config=json.dumps(EVIL_CONFIG), files={"file:1/model.py": evil_model_py(marker)})
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model("tensorrt_llm")
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model("tensorrt_llm", headers=admin_headers("not-the-key-0123456789"))
        time.sleep(1.0)
        assert not marker.exists()
        assert not client.is_model_ready("evil")
    finally:
        client.close()
    still_served(server)


def test_health_metadata_statistics_and_inference_stay_open(server):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/tensorrt_llm/ready", "/v2",
                 "/v2/models/tensorrt_llm", "/v2/models/tensorrt_llm/config", "/v2/models/tensorrt_llm/stats"):
        assert http_status(f"{server.http_url}{path}") == 200, path
    still_served(server)


def client_for(server: Server, protocol: str):
    return (grpcclient.InferenceServerClient(server.grpc_url) if protocol == "grpc"
            else httpclient.InferenceServerClient(server.http_url.removeprefix("http://")))


def change_server_settings(client, headers: dict[str, str] | None, region: str) -> list[str]:
    """Try each restricted change a client could make to the whole server; the ones refused, by protocol name."""
    attempts = {
        "logging": lambda: client.update_log_settings({"log_verbose_level": 0}, headers=headers),
        "trace": lambda: client.update_trace_settings(settings={"trace_rate": "1000"}, headers=headers),
        "shared-memory": lambda: client.register_system_shared_memory(region, f"/{region}", 64, headers=headers),
    }
    refused = []
    for name, attempt in attempts.items():
        try:
            attempt()
        except InferenceServerException as error:
            assert "restricted" in str(error), (name, error)
            refused.append(name)
    return refused


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_log_trace_and_shared_memory_settings_need_the_key(server, protocol):
    """Without the key a client could raise the log verbosity (every request's tensors into the log), start traces
    into files, or have the server map shared-memory regions: refused, over both protocols; the key opens them."""
    region = f"sec{protocol}{os.getpid()}"
    handle = shm.create_shared_memory_region(region, f"/{region}", 64)
    client = client_for(server, protocol)
    try:
        for headers in (None, admin_headers("not-the-key-0123456789")):
            assert change_server_settings(client, headers, region) == ["logging", "trace", "shared-memory"]
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_log_settings()
        key_headers = admin_headers(generated_key(server))
        assert change_server_settings(client, key_headers, region) == []
        regions = client.get_system_shared_memory_status(headers=key_headers)
        assert region in str(regions)
        client.unregister_system_shared_memory(region, headers=key_headers)
        assert client.get_log_settings(headers=key_headers)
    finally:
        client.close()
        shm.destroy_shared_memory_region(handle)
    still_served(server)


def test_with_the_key_the_operator_unloads_and_loads_and_the_key_is_never_logged(server):
    key = generated_key(server)
    headers = admin_headers(key)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.unload_model("tensorrt_llm", headers=headers)
        deadline = time.monotonic() + 10
        while client.is_model_ready("tensorrt_llm"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert http_post(server, "/v2/repository/models/tensorrt_llm/load", {}, headers)[0] == 200
    finally:
        client.close()
    still_served(server)
    assert key not in server.log()


def test_serve_stops_through_the_restricted_api(tmp_path):
    """SIGTERM to `trtllm-triton serve`: it unloads the models over the API (with its key) before it signals
    tritonserver. Without the key the unload is refused, and tritonserver sees the signal with its models loaded."""
    server = start_server(tmp_path, env={ADMIN_KEY_ENV: ""}, serve_args=["--log-verbose=1"])
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0
    log = server.log()
    # Verbose lines: the model's instance stops (its unload began) before the signal reaches tritonserver.
    unloading, signalled = log.find("Stopping backend thread for tensorrt_llm"), log.find("Signal (15) received")
    assert 0 <= unloading < signalled, log[-3000:]


def test_an_unusable_operator_key_stops_serve_with_a_message():
    done = subprocess.run([sys.executable, "-m", "trtllm_model.launch.cli", "serve", "--no-openai"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, ADMIN_KEY_ENV: "short:key"})
    assert done.returncode == 2 and f"{ADMIN_KEY_ENV} must be at least 16 characters" in done.stderr
