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
    path: Path, vocab_size: int = 32000, max_input_len: int = 256, max_beam_width: int = 4, max_batch_size: int = 8,
    max_seq_len: int = 4096, layout: str = "build_config",
) -> Path:
    """A directory shaped like an engine builder's output, which the fake executor loads.

    layout "build_config": trtllm-build's (a "version", pretrained_config + build_config, rank0.engine);
    "builder_config": the older builder's (no version, one builder_config section, <name>_<precision>_tp1_rank0.engine;
    max_seq_len given as max_input_len + max_output_len, as builders before max_seq_len wrote it).
    """
    path.mkdir(parents=True, exist_ok=True)
    limits = {"max_input_len": max_input_len, "max_beam_width": max_beam_width, "max_batch_size": max_batch_size}
    if layout == "build_config":
        config = {
            "version": "0.20.0",
            "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float16", "vocab_size": vocab_size,
                                  "mapping": {"tp_size": 1, "pp_size": 1}},
            "build_config": {**limits, "max_seq_len": max_seq_len, "max_num_tokens": 8192,
                             "plugin_config": {"paged_kv_cache": True, "tokens_per_block": 32}},
        }
        engine_name = "rank0.engine"
    elif layout == "builder_config":
        config = {
            "builder_config": {"name": "llama", "precision": "float16", "tensor_parallel": 1, "num_layers": 2,
                               "num_heads": 8, "hidden_size": 512, "vocab_size": vocab_size, **limits,
                               "max_output_len": max_seq_len - max_input_len},
            "plugin_config": {"paged_kv_cache": True, "tokens_per_block": 64, "remove_input_padding": True},
        }
        engine_name = "llama_float16_tp1_rank0.engine"
    else:
        raise ValueError(f"layout {layout!r}: build_config or builder_config")
    (path / "config.json").write_text(json.dumps(config))
    (path / engine_name).write_bytes(b"fake engine")
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
    # The project's config.pbtxt limits are over the fake engine's (a load error): unset, the engine's apply.
    parameters = {"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(workdir / "engine")),
                  "gpt_model_type": "inflight_fused_batching", "max_input_len": "", "max_output_len": "",
                  "max_batch_size": ""}
    repository = write_repository(workdir / "repository", parameters, ("tensorrt_llm",))
    config = repository / "tensorrt_llm" / "config.pbtxt"  # trtllm_engine refuses the synthetic executor's parameters
    config.write_text(re.sub(r'parameters: \{\s*key: "synthetic_[^"]*"[^}]*\}\s*\}\n', "", config.read_text()))
    # The stub ignores PYTHONPATH but puts the version directory on sys.path: the fake package goes there.
    shutil.copytree(FAKES_DIR / "tensorrt_llm", repository / "tensorrt_llm" / "1" / "tensorrt_llm")
    return repository
