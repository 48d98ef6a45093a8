"""The synthetic executor's paged KV cache: blocks as sequences grow, waiting when the pool is promised, stats."""

from __future__ import annotations

import time

import pytest

from trtllm_model.executor_interface import GenerationRequest, RequestRejected
from trtllm_model.executors.synthetic import SyntheticExecutor


def drain_until_final(executor: SyntheticExecutor, ids: set[int], timeout_s: float = 10.0) -> dict[int, int]:
    """Steps until every id in `ids` had its final step; returns id -> number of tokens."""
    tokens = dict.fromkeys(ids, 0)
    open_ids = set(ids)
    deadline = time.monotonic() + timeout_s
    while open_ids and time.monotonic() < deadline:
        for step in executor.await_steps(0.5):
            if step.request_id in tokens:
                tokens[step.request_id] += len(step.token_ids)
                if step.is_final:
                    open_ids.discard(step.request_id)
    assert not open_ids, f"no final step for {open_ids}"
    return tokens


def test_blocks_grow_with_each_sequence_and_return_when_it_ends():
    # 16 tokens per block, 64 blocks: a 20-token prompt holds 2 blocks, 3 after 13 tokens, 4 after 29.
    executor = SyntheticExecutor(step_ms=2.0, kv_cache_tokens=1024, tokens_per_block=16)
    try:
        request_id = executor.enqueue(GenerationRequest(input_ids=list(range(1, 21)), max_tokens=40))
        seen = []
        while True:
            steps = executor.await_steps(1.0)
            seen += [s.kv_cache for s in executor.iteration_stats()]
            if any(s.is_final and s.request_id == request_id for s in steps):
                break
        seen += [s.kv_cache for s in executor.iteration_stats()]
        used = [kv.used_blocks for kv in seen]
        assert all(kv.max_blocks == 64 and kv.tokens_per_block == 16 for kv in seen)
        assert all(kv.free_blocks == 64 - kv.used_blocks for kv in seen)
        assert used == sorted(used[:-1]) + [0]  # grows one block at a time, all returned at the end
        assert set(used[:-1]) == {2, 3, 4} and used[-1] == 0
    finally:
        executor.shutdown()


def test_requests_wait_while_the_pool_is_promised_and_join_as_it_frees():
    # 8 blocks of 16 tokens: each request needs 4 blocks at full length (4 + 60 tokens), so two run, two wait.
    executor = SyntheticExecutor(step_ms=5.0, kv_cache_tokens=128, tokens_per_block=16)
    try:
        ids = {executor.enqueue(GenerationRequest(input_ids=[1, 2, 3, i], max_tokens=60)) for i in range(4)}
        time.sleep(0.1)
        stats = executor.iteration_stats()[-1]
        assert (stats.active_requests, stats.queued_requests) == (2, 2)
        assert stats.kv_cache.used_blocks <= 8
        assert drain_until_final(executor, ids) == dict.fromkeys(ids, 60)  # the waiting ones ran after
        assert max(s.active_requests for s in executor.iteration_stats()) <= 2
    finally:
        executor.shutdown()


def test_a_request_that_could_never_fit_is_rejected_with_the_numbers():
    executor = SyntheticExecutor(kv_cache_tokens=128, tokens_per_block=16)
    try:
        with pytest.raises(RequestRejected, match=r"max_tokens: .*needs 9 KV-cache blocks; the pool has 8"):
            executor.enqueue(GenerationRequest(input_ids=[1, 2, 3, 4], max_tokens=140))
    finally:
        executor.shutdown()


def test_without_a_pool_there_are_no_kv_cache_stats():
    executor = SyntheticExecutor(step_ms=1.0)
    try:
        drain_until_final(executor, {executor.enqueue(GenerationRequest(input_ids=[5], max_tokens=3))})
        assert all(s.kv_cache is None for s in executor.iteration_stats())
    finally:
        executor.shutdown()
