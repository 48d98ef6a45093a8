"""The embedded engine is handed out (and the model reported ready) only after its warm-up: on a GPU that is the
decode steps' CUDA graphs and the compiled prompt forwards, 26-31 s on an H100, during which the first requests
waited while Triton said READY. A warm-up that fails fails the load with its error, instead of a ready model whose
every request then fails. The CPU has nothing to warm up, so the runner's warm-up is slowed or broken on purpose."""

from __future__ import annotations

import time

import pytest
import torch

from trtllm_model.embedded.engine import EngineDead
from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.executors import engine_worker
from trtllm_model.executors.engine_wire import EngineSpec
from trtllm_model.executors.transformers_executor import TransformersExecutor

WARM_UP_S = 1.0
SPEC = EngineSpec(model_dir=None, device="cpu", dtype="float32", max_batch_size=2, max_num_tokens=64, torch_threads=2)


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.fixture
def slow_warm_up(monkeypatch) -> list[float]:
    """The runner's graph capture takes WARM_UP_S; returns the times each capture ended."""
    ended: list[float] = []

    def capture(self, *args, **kwargs) -> int:
        time.sleep(WARM_UP_S)
        ended.append(time.monotonic())
        return 0

    monkeypatch.setattr(ModelRunner, "capture_decode_graphs", capture)
    return ended


@pytest.fixture
def broken_warm_up(monkeypatch) -> None:
    def capture(self, *args, **kwargs) -> int:
        raise RuntimeError("CUDA out of memory while capturing the decode graphs")

    monkeypatch.setattr(ModelRunner, "capture_decode_graphs", capture)


def test_the_executor_is_handed_out_only_after_its_warm_up(loaded, slow_warm_up):
    started = time.monotonic()
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=2)
    try:
        returned = time.monotonic()
        assert len(slow_warm_up) == 1 and slow_warm_up[0] <= returned
        assert returned - started >= WARM_UP_S
    finally:
        executor.shutdown()


def test_a_failed_warm_up_fails_the_executor_with_its_error(loaded, broken_warm_up):
    with pytest.raises(EngineDead, match="CUDA out of memory while capturing the decode graphs"):
        TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=2)


def test_the_engine_worker_reports_ready_only_after_its_warm_up(slow_warm_up):
    """`build_engine` is what the worker runs before it sends "ready" to the stub."""
    engine, info, _ = engine_worker.build_engine(SPEC, lambda steps: None)
    try:
        assert len(slow_warm_up) == 1 and slow_warm_up[0] <= time.monotonic()
        assert info.vocab_size > 0
    finally:
        engine.stop()


def test_an_engine_worker_whose_warm_up_fails_does_not_report_ready(broken_warm_up):
    with pytest.raises(EngineDead, match="CUDA out of memory while capturing"):
        engine_worker.build_engine(SPEC, lambda steps: None)
