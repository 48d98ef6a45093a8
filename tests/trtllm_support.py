"""Helpers for tests of the TensorRT-LLM executors: put the fake `tensorrt_llm` on the path, make model dirs."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import write_repository

FAKES_DIR = Path(__file__).resolve().parent / "fakes"


def forget_tensorrt_llm() -> None:
    """Drop imported tensorrt_llm modules, so the next import sees the current path and environment."""
    for name in [name for name in sys.modules if name == "tensorrt_llm" or name.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def use_fake_tensorrt_llm(monkeypatch: pytest.MonkeyPatch, step_ms: str = "1") -> None:
    """Make `import tensorrt_llm` find the fake for this test only (undone with monkeypatch, then forgotten)."""
    monkeypatch.syspath_prepend(str(FAKES_DIR))
    monkeypatch.setenv("FAKE_TRTLLM_STEP_MS", step_ms)
    forget_tensorrt_llm()


def make_engine_dir(
    path: Path, vocab_size: int = 32000, max_input_len: int = 256, max_beam_width: int = 4, max_batch_size: int = 8
) -> Path:
    """A directory shaped like trtllm-build's output (config.json + rank0.engine), which the fake executor loads."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "pretrained_config": {"architecture": "LlamaForCausalLM", "vocab_size": vocab_size},
        "build_config": {"max_input_len": max_input_len, "max_seq_len": 4096, "max_beam_width": max_beam_width,
                         "max_batch_size": max_batch_size},
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "rank0.engine").write_bytes(b"fake engine")
    return path


def make_checkpoint_dir(path: Path, vocab_size: int = 32000, max_position_embeddings: int = 4096) -> Path:
    """A directory shaped like a Hugging Face checkpoint (config.json), which the fake LLM API loads."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size,
              "max_position_embeddings": max_position_embeddings}
    (path / "config.json").write_text(json.dumps(config))
    return path


def fake_tokens(prompt: list[int], count: int, vocab_size: int = 32000, sequence: int = 0) -> list[int]:
    """The tokens the fake engine produces for `prompt` (see tests/fakes/tensorrt_llm/_engine.py)."""
    return [(prompt[-1] + 1 + i + 7 * sequence) % vocab_size for i in range(count)]


def collect_until_final(executor, request_ids: set[int], timeout_s: float = 10.0) -> list:
    """Every Step of `request_ids` until each has had its final step."""
    steps, open_ids = [], set(request_ids)
    deadline = time.monotonic() + timeout_s
    while open_ids:
        assert time.monotonic() < deadline, f"no final step for {sorted(open_ids)}; got {steps}"
        for step in executor.await_steps(0.5):
            steps.append(step)
            if step.is_final:
                open_ids.discard(step.request_id)
    return steps


def fake_engine_repository(workdir: Path) -> Path:
    """A model repository whose tensorrt_llm model runs trtllm_engine over the fake tensorrt_llm and a fake engine."""
    parameters = {"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(workdir / "engine")),
                  "gpt_model_type": "inflight_fused_batching"}
    repository = write_repository(workdir / "repository", parameters, ("tensorrt_llm",))
    config = repository / "tensorrt_llm" / "config.pbtxt"  # trtllm_engine refuses the synthetic executor's parameters
    config.write_text(re.sub(r'parameters: \{\s*key: "synthetic_[^"]*"[^}]*\}\s*\}\n', "", config.read_text()))
    # The stub ignores PYTHONPATH but puts the version directory on sys.path: the fake package goes there.
    shutil.copytree(FAKES_DIR / "tensorrt_llm", repository / "tensorrt_llm" / "1" / "tensorrt_llm")
    return repository
