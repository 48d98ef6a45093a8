"""docker-compose.yml is valid for docker-compose and has what a GPU deployment needs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def compose_config(*options: str, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), *options, "config"], capture_output=True, text=True,
        check=False, env={**os.environ, **(env or {})},
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_compose_file_validates_and_uses_nvidias_trtllm_image():
    config = compose_config()
    assert "nvcr.io/nvidia/tritonserver:" in config and "-trtllm-python-py3" in config
    assert "capabilities:\n              - gpu" in config or "- gpu" in config
    assert "/v2/models/tensorrt_llm/ready" in config
    for port in ("8000", "8001", "8002"):
        assert f"published: {port}" in config or f"{port}:{port}" in config


def test_every_service_starts_tritonserver_through_the_launcher_with_the_operators_key():
    """launch_trtllm.sh restricts the model-repository API (tests/test_launch_trtllm.py) to TRTLLM_TRITON_ADMIN_KEY,
    which the operator's environment passes through (empty: the launcher makes one)."""
    config = yaml.safe_load(compose_config("--profile", "llmapi", env={"TRTLLM_TRITON_ADMIN_KEY": "operator-key-0123456789"}))
    assert set(config["services"]) == {"triton-engine", "triton-llmapi"}
    for name, service in config["services"].items():
        assert service["entrypoint"] == ["bash", "/opt/trtllm_triton/deploy/launch_trtllm.sh"], name
        assert "command" not in service, name  # no tritonserver flags of its own
        assert service["environment"]["TRTLLM_TRITON_ADMIN_KEY"] == "operator-key-0123456789", name


def test_every_service_serves_the_openai_api_on_9000():
    """The launcher starts the OpenAI-compatible API next to tritonserver (tests/test_launch_trtllm.py) on
    OPENAI_PORT; each service sets it and publishes the port."""
    config = yaml.safe_load(compose_config("--profile", "llmapi"))
    for name, service in config["services"].items():
        assert service["environment"]["OPENAI_PORT"] == "9000", name
        assert any(port["published"] in ("9000", 9000) and port["target"] == 9000 for port in service["ports"]), name
