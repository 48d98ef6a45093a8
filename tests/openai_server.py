"""`trtllm-triton serve` with its OpenAI frontend on free ports, for tests/test_e2e_openai*.py."""

from __future__ import annotations

import time
from pathlib import Path

import requests
from conftest import Server, start_server

from trtllm_model.server import free_ports


def wait_for_frontend(base_url: str, server: Server | None = None, timeout_s: float = 120.0,
                      model_id: str = "tensorrt_llm") -> None:
    """Until GET /v1/models lists the token-level model as `model_id` (the frontend has loaded its tokenizer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server is not None and server.process.poll() is not None:
            raise RuntimeError(f"server exited ({server.process.returncode}):\n{server.log()[-6000:]}")
        try:
            models = requests.get(f"{base_url}/models", timeout=5).json()
            if any(m["id"] == model_id for m in models.get("data", [])):
                return
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"OpenAI frontend not up at {base_url} after {timeout_s} s:\n"
                       f"{server.log()[-6000:] if server else ''}")


def start_openai_server(workdir: Path, executor: str | None, parameters: dict[str, str] | None = None,
                        model_id: str = "tensorrt_llm", **server_options) -> tuple[Server, str]:
    """The server and the frontend's base URL (http://127.0.0.1:PORT/v1) once it lists `model_id`; `server_options`
    go to start_server (repository=, serve_args=: the LLM API layout)."""
    (port,) = free_ports(1)
    server = start_server(workdir, executor=executor, parameters=parameters, openai_port=port, **server_options)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_for_frontend(base_url, server, model_id=model_id)
    except Exception:
        server.stop()
        raise
    return server, base_url
