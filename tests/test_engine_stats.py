"""What the embedded engine reports per iteration for NVIDIA's gauge families (issue 34), over SmolLM2 on CPU:
memory by type (cpu, gpu, pinned), paused requests (preempted for KV blocks), micro batch id."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.transformers_executor import TransformersExecutor
from trtllm_model.serving.metrics import MEMORY_FAMILY, gauge_values


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


def test_a_cramped_pool_reports_paused_requests_and_what_memory_the_engine_holds(loaded):
    # 8 blocks of 16 tokens for 4 sequences of up to 40 tokens: they preempt each other.
    bytes_per_token = ModelRunner(loaded.model).kv_bytes_per_token
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, max_num_tokens=1024,
                                    kv_cache_memory_bytes=8 * 16 * bytes_per_token)
    try:
        executor.iteration_stats()
        requests = [GenerationRequest(input_ids=[200 + i, 300 + i], max_tokens=38, min_tokens=38) for i in range(4)]
        run_all(executor, requests)
        stats = executor.iteration_stats()
        assert executor.engine.scheduler.preemptions > 0
    finally:
        executor.shutdown()
    assert max(s.paused_requests for s in stats) > 0  # a preempted sequence waits with tokens already sent
    assert stats[-1].paused_requests == 0
    assert all(s.micro_batch_id == 0 for s in stats)
    # On the CPU the engine holds its weights and its KV pool in host memory, nothing in GPU or pinned memory.
    weights = sum(t.numel() * t.element_size() for t in [*loaded.model.parameters(), *loaded.model.buffers()])
    block = 16 * bytes_per_token  # the pool: the 8 blocks of the budget and one trash block
    assert weights + 8 * block <= stats[-1].cpu_mem_bytes <= weights + 9 * block
    gauges = gauge_values(stats[-1])
    assert {label for family, label in gauges if family == MEMORY_FAMILY} == {"cpu", "gpu", "pinned"}
    assert gauges[(MEMORY_FAMILY, "gpu")] == 0 and gauges[(MEMORY_FAMILY, "pinned")] == 0
