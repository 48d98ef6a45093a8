"""The embedded engine's numbers do not follow the host's load: cpu_share changes torch's intra-op threads before
each forward with the cores other processes leave free, and one greedy request must still give the same tokens and
bit-equal log probs however many threads each step got (NVIDIA's end_to_end_test.py --test-bls --return-log-probs
compares `ensemble` and `tensorrt_llm_bls` with np.array_equal)."""

from __future__ import annotations

import os

import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded.model_loading import load_model
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.transformers_executor import TransformersExecutor

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to vary the threads")

PROMPT = "Born in north-east France, Soyer trained as a"


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    return load_model()


def greedy_log_probs(loaded, threads_by_step: list[int]) -> tuple[list[int], list[float], float]:
    """One greedy request, each forward on the thread count `threads_by_step` gives it (as cpu_share would)."""
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4)
    forwards = iter(range(1 << 30))

    def set_threads(*_):
        torch.set_num_threads(threads_by_step[next(forwards) % len(threads_by_step)])

    hook = loaded.model.register_forward_pre_hook(set_threads)
    try:
        ids = loaded.tokenizer(PROMPT)["input_ids"]
        steps = run_all(executor, [GenerationRequest(input_ids=ids, max_tokens=24, return_log_probs=True)])[0]
    finally:
        hook.remove()
        executor.shutdown()
    tokens = [token for step in steps for token in step.token_ids]
    return tokens, [p for step in steps for p in step.log_probs or []], steps[-1].cum_log_prob


def test_log_probs_are_bit_equal_whatever_threads_each_step_gets(loaded):
    cores = len(os.sched_getaffinity(0))
    reference = greedy_log_probs(loaded, [cores])
    assert len(reference[1]) == 24
    for threads in ([1], [1, cores], [cores, 1, 1]):
        assert greedy_log_probs(loaded, threads) == reference, threads
