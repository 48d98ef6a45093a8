"""Prefix caching in the embedded engine (enable_kv_cache_reuse) over SmolLM2: only the uncached rest of a prompt is
prefilled, greedy outputs are token-identical with and without it, and a failed or cancelled prefill or an eviction
under pressure never changes another request's tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import run_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtllm_model.embedded import kv_cache as kv_cache_module
from trtllm_model.embedded.fused_forward import FusedForward
from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.executor_interface import FinishReason, GenerationRequest, Step
from trtllm_model.executors.transformers_executor import TransformersExecutor

MAX_TOKENS = 5
SHARED = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3437, 15362, 28, 7018, 411, 407, 19712, 20840,
          30, 2, 198, 1, 4093, 198]  # SmolLM2's chat header: what real prompts share


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.fixture(scope="module")
def reusing(loaded):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=16)
    yield executor
    executor.shutdown()


@pytest.fixture(scope="module")
def plain(loaded):
    """The reference: the same engine with prefix caching off."""
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=16, enable_kv_cache_reuse=False)
    yield executor
    executor.shutdown()


def greedy(prompt: list[int], max_tokens: int = MAX_TOKENS, **kwargs) -> GenerationRequest:
    return GenerationRequest(input_ids=prompt, max_tokens=max_tokens, min_tokens=max_tokens, **kwargs)


def tokens(steps: list[Step]) -> list[int]:
    assert steps[-1].error is None, steps[-1].error
    return [token for step in steps for token in step.token_ids]


def outputs(executor, waves: list[list[list[int]]]) -> list[list[int]]:
    """Each wave's prompts run together, the waves one after another."""
    return [tokens(steps) for wave in waves for steps in run_all(executor, [greedy(prompt) for prompt in wave])]


def all_blocks_free(executor) -> bool:
    blocks = executor.engine.blocks
    return blocks.free_blocks == blocks.num_blocks


prompt_token = st.integers(min_value=200, max_value=40000)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    base=st.lists(prompt_token, min_size=1, max_size=60),
    branches=st.lists(st.tuples(st.integers(0, 60), st.lists(prompt_token, min_size=1, max_size=20)),
                      min_size=1, max_size=4),
)
def test_greedy_outputs_are_identical_with_and_without_the_cache(reusing, plain, base, branches):
    """Prompts = the chat header + a random base cut anywhere + a random tail: the first alone (its blocks get cached),
    then the rest together (some share it, some share each other's blocks only in the next example)."""
    prompts = [SHARED + base] + [SHARED + base[:cut] + tail for cut, tail in branches]
    waves = [prompts[:1], prompts[1:]]
    reused_before = reusing.engine.blocks.total_reused
    assert outputs(reusing, waves) == outputs(plain, waves)
    assert reusing.engine.blocks.total_reused > reused_before  # the header's block at least came from the cache
    assert all_blocks_free(reusing) and all_blocks_free(plain)


def test_the_second_request_reports_reused_blocks_and_prefills_only_the_rest(reusing, plain):
    prompt = SHARED + list(range(3000, 3040))  # 64 tokens: 4 full blocks, the last one computed again
    first, second = (run_all(reusing, [greedy(prompt, return_perf_metrics=True)])[0] for _ in range(2))
    assert tokens(first) == tokens(second) == tokens(run_all(plain, [greedy(prompt)])[0])
    assert second[-1].kv_cache_reused_blocks == 3 and second[-1].kv_cache_alloc_new_blocks == 2  # + 1 for decode
    assert second[-1].kv_cache_alloc_total_blocks == 2  # TensorRT-LLM's meaning: allocated, reused ones not counted
    stats = reusing.iteration_stats()
    assert stats and stats[-1].kv_cache.reused_blocks >= 3 and 0.0 < stats[-1].kv_cache.cache_hit_rate <= 1.0
    prefills = [s.context_tokens for s in stats if s.context_requests]
    assert prefills[-1] == len(prompt) - 3 * 16  # only the uncached rest went through the model


def test_a_prefill_that_fails_part_way_leaves_nothing_another_request_reads(reusing, plain, monkeypatch):
    """The prefills of a prompt write half their layers and fail (the engine tries a prompt whose forward failed
    again alone): the same prompt next must not find its blocks."""
    prompt = SHARED + list(range(5000, 5050))
    armed = {"fail": True}

    def fail_half_way(index: int, queries: int) -> None:
        if armed["fail"] and index == 15 and queries > 1:  # a prefill, half way through the model
            raise RuntimeError("simulated failure mid-prefill")

    run_all(reusing, [greedy(SHARED + [5])])  # the chat header's block is cached, whatever ran before
    if reusing.runner.fused_forward is not None:  # the CPU's default: each layer's attention writes its keys
        attend = FusedForward._attend

        def failing_attend(self, pool, index, query, key, value, part):
            result = attend(self, pool, index, query, key, value, part)
            fail_half_way(index, query.shape[0] // part.rows)
            return result

        monkeypatch.setattr(FusedForward, "_attend", failing_attend)
    else:
        update = kv_cache_module._PoolLayer.update

        def failing_update(self, key_states, value_states, *args, **kwargs):
            result = update(self, key_states, value_states, *args, **kwargs)
            fail_half_way(self.index, key_states.shape[2])
            return result

        monkeypatch.setattr(kv_cache_module._PoolLayer, "update", failing_update)
    (failed,) = run_all(reusing, [greedy(prompt)])
    armed["fail"] = False
    assert failed[-1].finish_reason is FinishReason.ERROR and "mid-prefill" in failed[-1].error
    (again,) = run_all(reusing, [greedy(prompt, return_perf_metrics=True)])
    assert again[-1].kv_cache_reused_blocks == 1  # the chat header's block only: none the failed prefill wrote
    assert tokens(again) == tokens(run_all(plain, [greedy(prompt)])[0])
    assert all_blocks_free(reusing)


def test_a_cancel_during_prefill_leaves_the_others_intact(reusing, plain, monkeypatch):
    """A request is cancelled while its prefill runs, beside one decoding; one that shares its prefix comes after."""
    prompt = SHARED + list(range(7000, 7040))
    sharer = prompt[:48] + [11, 12, 13]
    runner = reusing.runner
    prefill_inputs = runner._prefill_inputs  # a prompt forward's, or the decode forward's that it shares
    target: dict[str, int] = {}

    def cancelling_prefill(sequences):
        if any(sequence.request_id == target.get("id") for sequence in sequences):
            reusing.cancel(target["id"])  # arrives while the forward runs
        return prefill_inputs(sequences)

    monkeypatch.setattr(runner, "_prefill_inputs", cancelling_prefill)
    decoding_id = reusing.enqueue(greedy(SHARED + [300, 301], max_tokens=12))
    target["id"] = reusing.enqueue(greedy(prompt, max_tokens=12))
    got: dict[int, list[Step]] = {decoding_id: [], target["id"]: []}
    while not all(s and s[-1].is_final for s in got.values()):
        for step in reusing.await_steps(1.0):
            got[step.request_id].append(step)
    assert got[target["id"]][-1].finish_reason is FinishReason.CANCELLED and len(tokens(got[target["id"]])) < 12
    (later,) = run_all(reusing, [greedy(sharer, return_perf_metrics=True)])
    assert later[-1].kv_cache_reused_blocks == 3  # the cancelled request's computed blocks serve it
    assert tokens(later) == tokens(run_all(plain, [greedy(sharer)])[0])
    assert tokens(got[decoding_id]) == tokens(run_all(plain, [greedy(SHARED + [300, 301], max_tokens=12)])[0])
    assert all_blocks_free(reusing)


def test_eviction_under_pressure_never_changes_a_running_requests_tokens(loaded, plain):
    """A pool of 12 blocks, requests of 3-4 blocks each from three prefix families, in overlapping waves: cached
    blocks are evicted to make room while others run on blocks they share."""
    block_bytes = 16 * ModelRunner(loaded.model).kv_bytes_per_token
    small = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, kv_cache_memory_bytes=12 * block_bytes)
    try:
        families = [SHARED + list(range(start, start + 20)) for start in (8000, 9000, 10000)]
        waves = [
            [families[0] + [1000], families[1] + [1001], families[0] + [1002]],
            [families[2] + [1003], families[0] + [1004], families[2] + [1005]],
            [families[1] + [1006], families[1] + [1007], families[0] + [1008], families[2] + [1009]],
        ]
        assert outputs(small, waves) == outputs(plain, waves)
        blocks = small.engine.blocks
        assert blocks.total_evicted > 0 and blocks.total_reused > 0
        assert all_blocks_free(small)
    finally:
        small.shutdown()


def test_the_static_shape_decode_gives_the_same_tokens(loaded, plain):
    """The CUDA layout on CPU: decode padded to bucketed rows and table widths, inputs copied into kept tensors."""
    static = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8)
    static.runner.static_shapes = True
    try:
        waves = [[SHARED + [400 + i] * (i * 7 + 1) for i in range(3)]]
        assert outputs(static, waves) == outputs(plain, waves)
        assert {key[0] for key in static.runner._static_inputs} <= {1, 2, 4}  # rows bucketed to powers of two
    finally:
        static.shutdown()


@pytest.mark.e2e
@pytest.mark.parametrize(("parameters", "expected"), [({}, [0, 3]), ({"enable_kv_cache_reuse": "false"}, [0, 0])])
def test_reuse_is_visible_in_the_perf_outputs_of_a_real_server(tmp_path, parameters, expected):
    """On by default: a fresh server, then 3 of the 4 full blocks (the last is always computed); off: none."""
    from conftest import start_server
    from triton_client import stream_once, token_inputs

    server = start_server(tmp_path, executor="transformers", parameters=parameters)
    try:
        prompt = SHARED + list(range(6000, 6040))
        reused = []
        for _ in range(2):
            result = stream_once(server.grpc_url, "tensorrt_llm",
                                 token_inputs(prompt, 2, return_perf_metrics=(True, np.bool_)), timeout_s=120)
            assert result.errors == [] and result.finals == 1
            reused.append(int(result.responses[-1].as_numpy("kv_cache_reused_blocks").reshape(-1)[0]))
        assert reused == expected
    finally:
        server.stop()


def test_requests_share_cached_blocks_only_under_the_same_cache_salt(reusing, plain):
    """vLLM's cache_salt: a salted request finds none of what others cached (its reuse count says so: it cannot
    learn what another client asked), the same salt shares, and the tokens are those of an uncached run."""
    prompt = SHARED + [4093, 5316, 30, 2683, 359, 253, 1234, 997, 5001, 6002, 7003]

    def reused(salt: str | None) -> tuple[int, list[int]]:
        (steps,) = run_all(reusing, [greedy(prompt, return_perf_metrics=True, cache_salt=salt)])
        return steps[-1].kv_cache_reused_blocks, tokens(steps)

    (expected,) = outputs(plain, [[prompt]])
    full_blocks = (len(prompt) - 1) // reusing.engine.blocks.block_size
    assert reused("tenant-a") == (0, expected)
    assert reused("tenant-b") == (0, expected)
    assert reused("tenant-a") == (full_blocks, expected)
    assert reused(None)[0] < full_blocks  # at most the chat header's block, which other tests cached unsalted
    assert reused(None) == (full_blocks, expected)
