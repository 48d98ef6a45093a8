"""bench/tiny_checkpoint.py: a random Llama small enough that the serving path's cost shows, served like SmolLM2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

from trtllm_model.embedded.model_loading import load_tokenizer  # noqa: E402
from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.engine_wire import EngineSpec  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402


def test_the_engine_worker_serves_the_tiny_checkpoint_with_smollm2s_tokenizer(tmp_path):
    directory = write_tiny_checkpoint(tmp_path / "tiny", layers=2, hidden=64)
    config = json.loads((directory / "config.json").read_text())
    assert (config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (49152, 2, 64)
    assert sum(f.stat().st_size for f in directory.iterdir()) < 32 * 2**20

    executor = TransformersExecutor.in_worker_process(EngineSpec(model_dir=str(directory), max_batch_size=4,
                                                                 max_num_tokens=256))
    try:
        text = "What is the capital of France?"
        assert executor.tokenizer().encode(text) == load_tokenizer().encode(text)
        request_id = executor.enqueue(GenerationRequest(input_ids=executor.tokenizer().encode(text), max_tokens=8,
                                                        min_tokens=8))
        steps = []
        while not any(step.is_final for step in steps):
            steps += [step for step in executor.await_steps(5.0) if step.request_id == request_id]
        assert sum(len(step.token_ids) for step in steps) == 8 and steps[-1].error is None
    finally:
        executor.shutdown()
