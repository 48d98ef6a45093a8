"""Scheduling by what a sequence needs now (issue 33), over SmolLM2 on CPU: a sequence preempted when the KV pool runs
out and recomputed later gives the greedy tokens of an uninterrupted run, no block leaks; a prompt longer than the
step's token budget is prefilled in chunks beside the decoding streams, with the tokens of one whole prefill."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import run_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.executor_interface import GenerationRequest, Step
from trtllm_model.executors.transformers_executor import TransformersExecutor


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.fixture(scope="module")
def roomy(loaded):
    """The reference: a pool that never runs out, a budget that never chunks."""
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, max_num_tokens=1024)
    yield executor
    executor.shutdown()


@pytest.fixture(scope="module")
def cramped(loaded):
    """8 blocks of 16 tokens for up to 4 sequences of up to 48 tokens each: they preempt each other."""
    budget = 8 * 16 * ModelRunner(loaded.model).kv_bytes_per_token
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, max_num_tokens=1024,
                                    kv_cache_memory_bytes=budget)
    yield executor
    executor.shutdown()


def tokens(steps: list[Step]) -> list[int]:
    assert steps[-1].error is None, steps[-1].error
    return [token for step in steps for token in step.token_ids]


def greedy(prompt: list[int], max_tokens: int) -> GenerationRequest:
    return GenerationRequest(input_ids=prompt, max_tokens=max_tokens, min_tokens=max_tokens)


def beside_decoding_streams(executor, streams: list[GenerationRequest], long_request: GenerationRequest,
                            decoding_steps: int) -> tuple[list[list[int]], list]:
    """Start `streams`; once they have `decoding_steps` steps between them, the long request. Returns every request's
    tokens (the streams', then the long one's) and the iteration stats since the long request came."""
    ids = [executor.enqueue(request) for request in streams]
    got: dict[int, list[Step]] = {request_id: [] for request_id in ids}

    def collect(until) -> None:
        while not until():
            for step in executor.await_steps(1.0):
                got[step.request_id].append(step)

    collect(lambda: sum(len(s) for s in got.values()) >= decoding_steps)  # the streams are decoding
    executor.iteration_stats()
    long_id = executor.enqueue(long_request)
    got[long_id] = []
    collect(lambda: all(s and s[-1].is_final for s in got.values()))
    return [tokens(got[request_id]) for request_id in [*ids, long_id]], executor.iteration_stats()


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(200, 40000), min_size=1, max_size=20), st.integers(10, 28)),
                min_size=2, max_size=4))
def test_preempted_and_resumed_sequences_give_the_tokens_of_an_uninterrupted_run(roomy, cramped, requests):
    requests = [greedy(prompt, max_tokens) for prompt, max_tokens in requests]
    expected = [tokens(steps) for steps in run_all(roomy, requests)]
    preempted = cramped.engine.scheduler.preemptions
    assert [tokens(steps) for steps in run_all(cramped, requests)] == expected
    blocks = cramped.engine.blocks
    assert blocks.free_blocks == blocks.num_blocks  # the pool filled, then every block came back
    if sum(len(r.input_ids) + r.max_tokens for r in requests) > 8 * 16 + 16 * len(requests):
        assert cramped.engine.scheduler.preemptions > preempted


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_streams_with_the_tokens_of_one_prefill(loaded, roomy):
    chunked = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, max_num_tokens=32,
                                   max_input_len=200)
    try:
        long_prompt = [200 + (i * 7919) % 30000 for i in range(150)]
        streams = [greedy([1, 504 + i], 40) for i in range(2)]
        expected = [tokens(steps) for steps in run_all(roomy, [*streams, greedy(long_prompt, 5)])]
        got, stats = beside_decoding_streams(chunked, streams, greedy(long_prompt, 5), decoding_steps=6)
        assert got == expected
        mixed = [s for s in stats if s.generation_requests and s.context_tokens]
        # The 150-token prompt went in chunks of at most 32 - 2 tokens, each step beside the two decoding streams.
        assert sum(s.context_tokens for s in mixed) >= 150 and max(s.tokens_in_step for s in stats) <= 32
    finally:
        chunked.shutdown()


def test_with_a_stall_factor_a_long_prompt_beside_decoding_streams_goes_in_chunks_with_the_same_tokens(loaded, roomy):
    # A stall factor (the CPU deployment's default is 4; 2.5 here): the full budget (1024) would take the whole prompt in
    # one step beside the streams; the steered budget splits it (the first chunk, before anything is learned, is 64).
    paced = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, max_num_tokens=1024,
                                 max_input_len=400, prefill_stall_factor=2.5)
    try:
        long_prompt = [200 + (i * 7919) % 30000 for i in range(300)]
        streams = [greedy([1, 604 + i], 60) for i in range(2)]
        expected = [tokens(steps) for steps in run_all(roomy, [*streams, greedy(long_prompt, 4)])]
        got, stats = beside_decoding_streams(paced, streams, greedy(long_prompt, 4), decoding_steps=10)
        assert got == expected
        mixed = [s.context_tokens for s in stats if s.generation_requests and s.context_tokens]
        assert len(mixed) >= 2 and mixed[0] == 64 and max(mixed) < 300, mixed
    finally:
        paced.shutdown()


def test_a_prompt_longer_than_the_step_budget_finishes_on_an_idle_engine(loaded, roomy):
    """Nothing else running: the engine must not go idle between its chunks (it waited for new work, forever)."""
    chunked = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, max_num_tokens=32,
                                   max_input_len=200)
    try:
        long_prompt = [200 + (i * 7919) % 30000 for i in range(100)]
        (expected,) = run_all(roomy, [greedy(long_prompt, 3)])
        (got,) = run_all(chunked, [greedy(long_prompt, 3)], timeout_s=60)
        assert tokens(got) == tokens(expected)
    finally:
        chunked.shutdown()
