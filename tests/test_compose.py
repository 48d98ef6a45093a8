"""docker-compose.yml is valid for docker-compose and has what a GPU deployment needs."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compose_config() -> str:
    completed = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_compose_file_validates_and_uses_nvidias_trtllm_image():
    config = compose_config()
    assert "nvcr.io/nvidia/tritonserver:" in config and "-trtllm-python-py3" in config
    assert "capabilities:\n              - gpu" in config or "- gpu" in config
    assert "/v2/health/ready" in config
    for port in ("8000", "8001", "8002"):
        assert f"published: {port}" in config or f"{port}:{port}" in config
