"""A real tritonserver for end-to-end tests: started through `trtllm-triton serve` on free ports, stopped after."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter (tests/test_paged_attention.py). It must be on before
# anything imports Triton, and never on a GPU host, where the CUDA tests run the compiled kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from trtllm_model.server import ADMIN_KEY_ENV, DEFAULT_REPOSITORY, admin_headers, free_ports, is_ready

TESTS_DIR = Path(__file__).resolve().parent
# What tritonserver logs, once a second, while its stop waits for the HTTP connections clients keep open.
HELD_HTTP_CONNECTIONS = "HTTP service connections"

# Whether the test being set up is marked e2e; None outside pytest (bench scripts call start_server too).
_test_is_e2e: bool | None = None


def pytest_runtest_setup(item: pytest.Item) -> None:
    global _test_is_e2e
    _test_is_e2e = item.get_closest_marker("e2e") is not None


# The shared servers that hold a model stop after the last test that uses them, not at the session's end.
_model_servers: dict[str, Server] = {}  # fixture name -> its server, while it runs
_last_user: dict[str, str] = {}  # fixture name -> node id of the last test that uses it


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        for name in getattr(item, "fixturenames", ()):
            _last_user[name] = item.nodeid


def pytest_runtest_teardown(item: pytest.Item) -> None:
    for name in [name for name in _model_servers if _last_user.get(name) == item.nodeid]:
        _model_servers.pop(name).stop()


@dataclass
class Server:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    repository: Path
    admin_key: str  # opens the model-repository API (load, unload, index); empty: the server generated its own

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP headers / gRPC metadata for the model-repository API (tritonclient's `headers=`)."""
        return admin_headers(self.admin_key)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self.log_path.exists() and HELD_HTTP_CONNECTIONS in self.log():
            # tritonserver waits its whole exit timeout (15 s) for an HTTP connection a client keeps open: a test
            # that stops its server closes its clients (client.close(), a `Connection: close` request) first.
            warnings.warn(f"the stop waited on an open HTTP connection ({self.log_path})", stacklevel=2)
        return code


def set_parameters(config_text: str, parameters: dict[str, str]) -> str:
    """Set (or add) `parameters` entries of a config.pbtxt."""
    for key, value in parameters.items():
        pattern = re.compile(r'parameters: \{\s*key: "' + re.escape(key) + r'"\s*value: \{ string_value: "[^"]*" \}\s*\}\n')
        config_text = pattern.sub("", config_text)
        config_text += f'parameters: {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}\n'
    return config_text


def write_repository(
    target: Path,
    parameters: dict[str, str] | None = None,
    models: tuple[str, ...] = ("tensorrt_llm", "ensemble"),
    config_edits: dict[str, str] | None = None,
    source: Path = DEFAULT_REPOSITORY,
) -> Path:
    """A copy of the project's model repository with some `tensorrt_llm` parameters or config text changed."""
    if target.exists():
        shutil.rmtree(target)
    for model in models:
        shutil.copytree(source / model, target / model, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "tensorrt_llm" / "config.pbtxt"
    text = set_parameters(config.read_text(), parameters or {})
    for old, new in (config_edits or {}).items():
        assert old in text, f"config edit target not found: {old!r}"
        text = text.replace(old, new)
    config.write_text(text)
    return target


def start_server(
    workdir: Path,
    executor: str | None = "synthetic",
    parameters: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    repository: Path | None = None,
    models: tuple[str, ...] = ("tensorrt_llm", "ensemble"),
    config_edits: dict[str, str] | None = None,
    ready_timeout_s: float = 300.0,
    expect_ready: bool = True,
    server_args: list[str] | None = None,
    cwd: Path | None = None,
    openai_port: int | None = None,
    serve_args: list[str] | None = None,
    new_session: bool = False,
) -> Server:
    """Start `trtllm-triton serve` on free ports; returns once every model is ready (or raises with the log).

    `serve_args` go to `trtllm-triton serve`, `server_args` to tritonserver itself (after `--`), after any in
    $TRITON_SERVER_ARGS (space-separated flags a host needs for every server, e.g. bench/gpu/probe_outputs.py's
    choice on a GPU host); `cwd` is the server's working directory; `new_session` starts it in its own process
    group, as a terminal or systemd would; the OpenAI frontend runs only with an `openai_port`
    (tests/test_e2e_openai*.py wait for it themselves)."""
    if _test_is_e2e is False:  # `make test-quick` runs `-m "not e2e"` and must start no server
        raise RuntimeError("a test that starts tritonserver is marked e2e (pytestmark = pytest.mark.e2e)")
    server_args = [*os.environ.get("TRITON_SERVER_ARGS", "").split(), *(server_args or [])]
    workdir.mkdir(parents=True, exist_ok=True)
    if repository is None:
        repository = write_repository(workdir / "repository", parameters, models, config_edits)
    http_port, grpc_port, metrics_port = free_ports(3)
    log_path = workdir / "server.log"
    command = [
        sys.executable, "-m", "trtllm_model.launch.cli", "serve",
        f"--model-repository={repository}", f"--http-port={http_port}", f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}", f"--ready-timeout={ready_timeout_s}",
    ]
    if executor:
        command.append(f"--executor={executor}")
    command.append("--no-openai" if openai_port is None else f"--openai-port={openai_port}")
    command += serve_args or []
    if server_args:
        command += ["--", *server_args]
    # Tests that load or unload models send this key (server.admin_headers); env={ADMIN_KEY_ENV: ""} lets serve
    # generate its own, as `make serve` does.
    environment = {**os.environ, ADMIN_KEY_ENV: secrets.token_urlsafe(24)}
    environment.update(env or {})
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=environment, cwd=cwd,
                                   start_new_session=new_session)
    server = Server(process, http_port, grpc_port, metrics_port, log_path, repository, environment[ADMIN_KEY_ENV])
    if not expect_ready:
        return server
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tritonserver exited ({process.returncode}):\n{log_excerpt(server.log())}")
        if is_ready("127.0.0.1", http_port) and "trtllm-triton: ready" in server.log():
            return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"tritonserver not ready after {ready_timeout_s} s:\n{log_excerpt(server.log())}")


# A line of an error or of a traceback (its frames included), wherever it is in the log.
_ERROR_LINE = re.compile(r'error|Error|Traceback|raise|^\s+File "')


def log_excerpt(log: str, tail_chars: int = 6000, max_error_lines: int = 300) -> str:
    """The log's error and traceback lines first (the cause, however much followed it), then its tail."""
    errors = [line for line in log.splitlines() if _ERROR_LINE.search(line)]
    if len(errors) > max_error_lines:
        errors = [*errors[:max_error_lines], f"... {len(errors) - max_error_lines} more error lines"]
    lines = "\n".join(errors)
    return f"--- error lines:\n{lines}\n--- the log's last {tail_chars} characters:\n{log[-tail_chars:]}"


@pytest.fixture(scope="session")
def synthetic_server(tmp_path_factory):
    """One server with the synthetic executor (10 ms steps) shared by the end-to-end tests that don't stop it."""
    server = start_server(tmp_path_factory.mktemp("synthetic"), executor="synthetic")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory):
    """One server with the embedded SmolLM2 (4 batch slots) shared by the end-to-end tests that neither stop nor
    reconfigure it: one model load instead of one a module."""
    server = _model_servers["smollm2_server"] = start_server(
        tmp_path_factory.mktemp("smollm2"), executor="transformers", parameters={"max_batch_size": "4"})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm2_openai_server(tmp_path_factory):
    """The embedded SmolLM2 with the repository's defaults and the OpenAI frontend, (server, base URL), shared by
    the OpenAI end-to-end tests that neither stop nor reconfigure it."""
    from openai_server import start_openai_server  # it imports this module

    server, base_url = start_openai_server(tmp_path_factory.mktemp("smollm2-openai"), "transformers")
    _model_servers["smollm2_openai_server"] = server
    yield server, base_url
    server.stop()


def _llmapi_openai_server(tmp_path_factory, name: str, serve_args: list[str]) -> tuple[Server, str]:
    from openai_server import start_openai_server  # it imports this module
    from test_e2e_llmapi import copy_repository

    workdir = tmp_path_factory.mktemp(name)
    server, base_url = start_openai_server(workdir, None, repository=copy_repository(workdir / "repository"),
                                           serve_args=serve_args)
    _model_servers[name] = server
    return server, base_url


@pytest.fixture(scope="session")
def llmapi_unary_server(tmp_path_factory):
    """model_repository_llmapi unary (decoupled: False, as NVIDIA's model.yaml; `serve --decoupled false`, since
    with its OpenAI API `serve` would serve it decoupled), the embedded SmolLM2, with the OpenAI frontend: (server,
    base URL), shared by the LLM API layout's e2e tests that neither stop nor change it."""
    server, base_url = _llmapi_openai_server(tmp_path_factory, "llmapi_unary_server", ["--decoupled", "false"])
    yield server, base_url
    server.stop()


@pytest.fixture(scope="session")
def llmapi_stream_server(tmp_path_factory):
    """The same as `serve` runs it by default with its OpenAI API: decoupled, for streaming clients."""
    server, base_url = _llmapi_openai_server(tmp_path_factory, "llmapi_stream_server", [])
    yield server, base_url
    server.stop()


@pytest.fixture(scope="session")
def unary_server(tmp_path_factory):
    """The synthetic executor served non-decoupled (`serve --decoupled false`): one response per request."""
    server = start_server(tmp_path_factory.mktemp("unary"), executor="synthetic", serve_args=["--decoupled", "false"])
    yield server
    server.stop()


@pytest.fixture
def busy_core():
    """One process spinning on a core beside the test, as a busy CI node or a neighbour on the host would."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield spinner
    spinner.kill()
    spinner.wait()
