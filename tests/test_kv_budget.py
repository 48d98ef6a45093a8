"""The embedded engine's KV-cache memory budget, steps merged for a slow reader, and failures pinned on one request.

Scheduler tests run without a model; the rest drive the embedded SmolLM2 through the transformers executor.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded import engine as engine_module
from trtllm_model.embedded.block_manager import BlockManager
from trtllm_model.embedded.decode_graphs import graph_outputs_bytes
from trtllm_model.embedded.kv_budget import DEFAULT_CPU_KV_CACHE_BYTES, PLAN_MARGIN_BYTES, MemoryPlan
from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.embedded.scheduler import Scheduler, SchedulerLimits
from trtllm_model.embedded.sequence import Sequence
from trtllm_model.executor_interface import FinishReason, GenerationRequest, RequestRejected, Step
from trtllm_model.executors.transformers_executor import PARAMETERS, TransformersExecutor, create
from trtllm_model.params import ConfigError, Params

BLOCK = 4  # tokens per block in the scheduler tests


def sequence(request_id: int, prompt_len: int, max_tokens: int, first_token: int = 1) -> Sequence:
    request = GenerationRequest(input_ids=[first_token + i for i in range(prompt_len)], max_tokens=max_tokens)
    return Sequence.from_request(request_id, request, vocab_size=1000, default_end_id=None)


def scheduler(num_blocks: int, max_batch_size: int = 8, max_num_tokens: int = 1000) -> Scheduler:
    return Scheduler(SchedulerLimits(max_batch_size, max_num_tokens), BlockManager(num_blocks, BLOCK))


def test_admission_takes_only_the_blocks_a_prompt_needs_now():
    """Three requests of 10 + 30 tokens take 3 blocks each (nothing set aside for max_tokens, issue 33): all run.
    A prompt that does not fit waits, and holds back the ones behind it (first come, first served)."""
    queue = scheduler(num_blocks=12)
    first, second, third = sequence(1, 10, 30), sequence(2, 10, 30, 100), sequence(3, 10, 30, 200)
    for each in (first, second, third):
        queue.add(each)
    running = queue.admit([])
    assert running == [first, second, third] and queue.blocks.free_blocks == 3
    for each in running:
        queue.prefilled(each)  # as the engine does once their prompts are computed
    long, later = sequence(4, 20, 5, 300), sequence(5, 2, 2, 400)
    queue.add(long)
    queue.add(later)
    assert queue.admit(running) == []  # 5 blocks needed, 3 free; `later` would fit but waits its turn
    queue.blocks.free(first.blocks)
    assert queue.admit([second, third]) == [long, later]


def test_when_the_pool_runs_out_the_newest_sequence_is_preempted_and_queued_first():
    queue = scheduler(num_blocks=4)
    old, new = sequence(1, 7, 30), sequence(2, 8, 30, 100)
    queue.add(old)
    queue.add(new)
    running = queue.admit([])
    for each in running:
        queue.prefilled(each)
        each.num_computed = len(each.token_ids)
        each.token_ids.append(5)  # its first output token, fed by the next decode step
    assert queue.make_room_for_decode(running) == [old]  # old needs a third block: new gives its two back
    assert list(queue.waiting) == [new] and new.blocks is None and new.num_computed == 0
    assert queue.preemptions == 1 and queue.blocks.free_blocks == 2


def test_a_cached_prefix_costs_no_prefill_tokens():
    """max_num_tokens counts what the prefill computes: a prompt whose first 8 tokens are cached needs 4 of 12."""
    queue = scheduler(num_blocks=20, max_num_tokens=5)
    warm = sequence(1, 12, 1)
    queue.blocks.register_full_blocks(queue.blocks.allocate(warm.token_ids, 12), warm.token_ids, 12)
    queue.add(sequence(2, 12, 1))
    (again,) = queue.admit([])
    assert again.num_computed == 8 and again.prefill_len == 4


# -- with the model ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


def new_executor(loaded, **limits) -> TransformersExecutor:
    return TransformersExecutor(loaded.model, loaded.tokenizer, **limits)


def slots(loaded, count: int) -> int:
    """The budget in bytes that holds `count` token slots of this model's cache (blocks of 16: count // 16 blocks)."""
    return count * ModelRunner(loaded.model).kv_bytes_per_token


def tokens_of(steps: list[Step]) -> list[int]:
    return [token for step in steps for token in step.token_ids]


def test_a_newcomer_is_prefilled_beside_a_partly_prefilled_long_prompt():
    """A 1,000-token prompt prefills 64 tokens a step; a 100-token newcomer joins with half of a step and the two then
    share each step (what the newcomer's last chunk leaves goes to the long one), so the newcomer's prompt is done
    in 4 steps while the long one goes on: a prefill in progress no longer takes every step's tokens."""
    s = scheduler(num_blocks=400)
    long, newcomer = sequence(1, 1000, 4), sequence(2, 100, 4, first_token=5000)
    s.add(long)
    assert s.admit([], prompt_tokens=64) == [long] and long.prefill_len == 64
    long.num_computed = long.prefill_end
    s.add(newcomer)
    steps = 0
    while newcomer.num_computed < 100:
        scheduled = s.admit([], prompt_tokens=64)
        assert long in scheduled and newcomer in scheduled and sum(seq.prefill_len for seq in scheduled) == 64
        for seq in scheduled:
            seq.num_computed = seq.prefill_end
        steps += 1
    assert steps == 4 and long.num_computed == 64 + 32 + 32 + 32 + 60


def test_the_default_budget_and_the_parameter(loaded):
    executor = new_executor(loaded)
    try:
        assert executor.kv_budget.memory_bytes == DEFAULT_CPU_KV_CACHE_BYTES == 1 << 30
        assert executor.kv_budget.bytes_per_slot == 2 * 30 * 3 * 64 * 4  # K and V, SmolLM2's layers x heads x dim
    finally:
        executor.shutdown()
    assert "kv_cache_memory_bytes" in PARAMETERS
    configured = create(Params({"torch_threads": "2", "kv_cache_memory_bytes": "4608000", "dtype": "float32"},
                               PARAMETERS))
    try:
        assert configured.kv_budget.num_blocks == 6 and configured.kv_budget.max_slots == 96  # 100 slots, whole blocks
    finally:
        configured.shutdown()


def test_a_request_that_could_never_fit_is_refused_at_enqueue(loaded):
    executor = new_executor(loaded, kv_cache_memory_bytes=slots(loaded, 100))  # 6 blocks of 16 tokens
    try:
        with pytest.raises(RequestRejected, match="kv_cache_memory_bytes") as error:
            executor.enqueue(GenerationRequest(input_ids=[1, 2, 3], max_tokens=94))
        assert not error.value.unsupported and "needs 7 KV-cache blocks" in str(error.value)
        assert "holds 6" in str(error.value)
        executor.enqueue(GenerationRequest(input_ids=[1, 2, 3], max_tokens=93))  # exactly fits
    finally:
        executor.shutdown()


def test_requests_beyond_the_budget_preempt_each_other_and_all_complete(loaded):
    """Budget 6 blocks; each request lives to 3 + 30 tokens (3 blocks): all four start at once (one block each), the
    pool runs out as they grow, the newest are preempted and recomputed; each gets the tokens it gets alone."""
    executor = new_executor(loaded, kv_cache_memory_bytes=slots(loaded, 100))
    try:
        requests = [GenerationRequest(input_ids=[1, 504, 3575 + i], max_tokens=30, min_tokens=30) for i in range(4)]
        alone = [tokens_of(run_all(executor, [request])[0]) for request in requests]
        executor.iteration_stats()
        results = run_all(executor, requests)
        assert [tokens_of(steps) for steps in results] == alone
        assert all(steps[-1].finish_reason is FinishReason.LENGTH for steps in results)
        stats = executor.iteration_stats()
        assert max(s.active_requests for s in stats) == 4 and executor.engine.scheduler.preemptions > 0
        assert {s.kv_cache.max_blocks for s in stats} == {6} and {s.kv_cache.tokens_per_block for s in stats} == {16}
        assert max(s.kv_cache.used_blocks for s in stats) == 6
        assert all(s.kv_cache.free_blocks == 6 - s.kv_cache.used_blocks for s in stats)
        assert executor.engine.blocks.free_blocks == 6  # nothing leaked
        assert executor.runner.pool.num_blocks == 6 + 1  # the pool never grows: the budget + the trash block
    finally:
        executor.shutdown()


def test_a_slow_reader_gets_every_generation_logits_row(loaded):
    """Steps a reader has not taken yet merge into one; it must carry one logits row per token."""
    executor = new_executor(loaded)
    try:
        request = GenerationRequest(input_ids=[1, 504, 3575], max_tokens=5, min_tokens=5,
                                    return_generation_logits=True, return_context_logits=True,
                                    return_perf_metrics=True)
        request_id = executor.enqueue(request)
        engine = executor.engine
        deadline = time.monotonic() + 120
        while True:  # read nothing until the request has ended
            with engine._lock:
                if any(step.is_final for step in engine._steps):
                    break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (step,) = executor.await_steps(1.0)
        assert step.request_id == request_id and step.is_final and len(step.token_ids) == 5
        assert step.generation_logits.shape == (1, 5, engine.runner.vocab_size)
        assert [int(row.argmax()) for row in step.generation_logits[0]] == step.token_ids  # greedy
        assert step.context_logits.shape == (3, engine.runner.vocab_size)
        assert step.kv_cache_alloc_total_blocks == 1  # 3 + 4 positions written, one block of 16
    finally:
        executor.shutdown()


def test_context_logits_come_from_the_prompts_chunks_and_equal_a_whole_forwards(loaded):
    """A 100-token prompt prefilled in chunks of at most 32 tokens (max_num_tokens), its cached prefix not used: its
    context logits are its chunks' logits at every token, those of one forward over the whole prompt."""
    executor = new_executor(loaded, max_num_tokens=32, max_input_len=200)
    prompt = [1 + (i * 7919) % 40000 for i in range(100)]
    try:
        run_all(executor, [GenerationRequest(input_ids=prompt, max_tokens=1)])  # its blocks are cached now
        (steps,) = run_all(executor, [GenerationRequest(input_ids=prompt, max_tokens=1, return_context_logits=True)])
        (context,) = [step.context_logits for step in steps if step.context_logits is not None]
        with torch.inference_mode():
            whole = loaded.model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float().numpy()
        assert context.shape == whole.shape == (100, executor.runner.vocab_size)
        np.testing.assert_allclose(context, whole, atol=0.5 if loaded.model.dtype == torch.bfloat16 else 1e-3)
        assert (context.argmax(axis=1) == whole.argmax(axis=1)).mean() > 0.95
    finally:
        executor.shutdown()


BAD_TOKEN = 4242  # the prompt token that makes the patched runner fail


@pytest.mark.parametrize("stage", ["prefill", "sampling", "context_logits"])
def test_a_failure_caused_by_one_request_fails_only_that_request(loaded, monkeypatch, stage):
    executor = new_executor(loaded)
    runner = executor.runner
    if stage == "prefill":
        forward = runner._forward

        def failing_forward(*parts):
            # A forward with the bad prompt's chunk (several queries a row): its own, or the decode step's that it
            # shares on the CPU (runner.mixes_prompts), which the engine then runs again without the prompts.
            if any(part.input_ids.shape[1] > 1 and bool((part.input_ids == BAD_TOKEN).any()) for part in parts):
                raise RuntimeError("simulated prefill failure")
            return forward(*parts)

        monkeypatch.setattr(runner, "_forward", failing_forward)
    elif stage == "sampling":
        sample = engine_module.sample_next_tokens

        def failing_sample(logits, states):
            # Fails in decode, once the bad request has run a few steps beside the others.
            if any(BAD_TOKEN in state.token_ids and state.num_output >= 3 for state in states):
                raise RuntimeError("simulated sampling failure")
            return sample(logits, states)

        monkeypatch.setattr(engine_module, "sample_next_tokens", failing_sample)
    else:
        def failing_prefill_logits(sequence):
            raise RuntimeError("simulated context logits failure")

        monkeypatch.setattr(runner, "prefill_logits", failing_prefill_logits)
    try:
        good = [GenerationRequest(input_ids=[1, 504, 3575 + i, 28], max_tokens=8, min_tokens=8) for i in range(2)]
        bad = GenerationRequest(input_ids=[1, 504, BAD_TOKEN, 28], max_tokens=8, min_tokens=8,
                                return_context_logits=stage == "context_logits")
        (alone,) = run_all(executor, [good[0]])
        first, failed, second = run_all(executor, [good[0], bad, good[1]])  # one prefill group, one batch
        assert failed[-1].is_final and failed[-1].finish_reason is FinishReason.ERROR
        assert f"simulated {stage.replace('_', ' ')} failure" in failed[-1].error
        assert sum(step.is_final for step in failed) == 1
        for steps in (first, second):
            assert steps[-1].error is None and len(tokens_of(steps)) == 8
        assert tokens_of(first) == tokens_of(alone)  # the batch's cache stayed right for the others
        # The engine goes on serving, its rows freed.
        (after,) = run_all(executor, [good[0]])
        assert tokens_of(after) == tokens_of(alone)
        assert executor.health_error() is None and executor.engine.running == []
        assert executor.engine.blocks.free_blocks == executor.engine.blocks.num_blocks  # no block leaked
    finally:
        executor.shutdown()


def test_requests_failing_one_after_another_fail_only_themselves(loaded, monkeypatch):
    """Twelve requests whose prefill fails, one after another, each end with their own error; the engine goes on (the
    rule that eight failures in a row stop it let a client's requests stop it for everyone, issue 31)."""
    executor = new_executor(loaded)
    forward = executor.runner._forward

    def broken(*parts):
        if any(part.input_ids.shape[1] > 1 for part in parts):  # a prompt's chunk among them
            raise RuntimeError("simulated failed prefill")
        return forward(*parts)

    monkeypatch.setattr(executor.runner, "_forward", broken)
    try:
        for i in range(12):
            (steps,) = run_all(executor, [GenerationRequest(input_ids=[1, 2 + i], max_tokens=2)])
            assert "simulated failed prefill" in steps[-1].error
        assert executor.health_error() is None
        monkeypatch.setattr(executor.runner, "_forward", forward)
        (steps,) = run_all(executor, [GenerationRequest(input_ids=[1, 2], max_tokens=2, min_tokens=2)])
        assert steps[-1].error is None and len(tokens_of(steps)) == 2
    finally:
        executor.shutdown()


@pytest.mark.e2e
def test_a_server_with_a_small_budget_refuses_what_never_fits_and_queues_the_rest(tmp_path):
    """kv_cache_memory_bytes in config.pbtxt: 100 token slots of SmolLM2 (46080 bytes each in float32), 6 blocks."""
    from conftest import start_server
    from prometheus_text import scrape
    from triton_client import StreamClient, stream_once, token_inputs

    server = start_server(tmp_path, executor="transformers",
                          parameters={"kv_cache_memory_bytes": str(100 * 46080), "dtype": "float32"})
    try:
        refused = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 504, 3575], 98), timeout_s=60)
        assert refused.finals == 1 and refused.responses == [] and len(refused.errors) == 1
        assert refused.errors[0].startswith("INVALID_ARG") and "kv_cache_memory_bytes" in refused.errors[0]
        # Five requests of 3 + 30 tokens (3 blocks each): two fit at once, the others wait for blocks, none fails.
        client = StreamClient(server.grpc_url)
        try:
            results = [
                client.send("tensorrt_llm", token_inputs([1, 504, 3575 + i], 30, min_tokens=(30, np.int32)), f"r{i}")
                for i in range(5)
            ]
            for result in results:
                result.wait(300)
        finally:
            client.close()
        assert [(r.errors, r.finals, len(r.tokens())) for r in results] == [([], 1, 30)] * 5
        deadline = time.monotonic() + 30  # the metrics thread publishes the stats every stats_check_period_ms
        while not scrape(server.metrics_url).find("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max"):
            assert time.monotonic() < deadline, "no KV-cache metrics"
            time.sleep(0.2)
        max_blocks = scrape(server.metrics_url).find("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max")
        assert set(max_blocks.values()) == {6}
    finally:
        server.stop()


# -- the memory plan on CUDA (kv_budget.MemoryPlan), with a device's memory given to it ------------------------------
SMOLLM2_VOCAB = 49152
SMOLLM2_BLOCKS = 8192 // 16  # a sequence's most blocks: max_position_embeddings / block size


def smollm2_plan(max_batch_size: int, total_gib: float = 79.1, fraction: float = 0.9) -> MemoryPlan:
    """A plan for SmolLM2 in bfloat16 on a card of `total_gib`, the graphs estimated as the engine does (decode
    steps of max_batch_size + GRAPH_PREFILL_ROWS rows, 4 greedy steps, max_num_tokens 8192)."""
    gib = 1 << 30
    rows = max_batch_size + engine_module.GRAPH_PREFILL_ROWS
    decode = rows * SMOLLM2_VOCAB * 4 + (256 << 20)
    graphs = decode + graph_outputs_bytes(rows, SMOLLM2_BLOCKS, SMOLLM2_VOCAB, 4, max_batch_size, 8192, joined=True)
    return MemoryPlan(total_bytes=int(total_gib * gib), free_bytes=int((total_gib - 1.2) * gib),
                      weights_bytes=int(0.27 * gib), prefill_bytes=int(3.5 * gib), decode_bytes=decode,
                      graph_bytes=graphs, fraction=fraction)


def test_the_pool_gets_its_fraction_of_what_activations_and_graphs_leave():
    plan = smollm2_plan(512)
    left = plan.free_bytes - max(plan.prefill_bytes, plan.decode_bytes) - plan.graph_bytes - PLAN_MARGIN_BYTES
    assert plan.pool_bytes == int(left * 0.9)
    # The old sizing (0.9 of the free memory, nothing set aside) gave the pool what the graphs and the warm-up's
    # prompt forward then needed: 512 streams failed with CUDA out of memory.
    needs = plan.pool_bytes + plan.prefill_bytes + plan.graph_bytes
    assert needs + PLAN_MARGIN_BYTES <= plan.free_bytes
    assert 0.9 * plan.free_bytes + plan.prefill_bytes + plan.graph_bytes > plan.free_bytes


def test_graphs_estimate_grows_with_the_batch_and_counts_every_bucket_output():
    small, large = (graph_outputs_bytes(rows, SMOLLM2_BLOCKS, SMOLLM2_VOCAB) for rows in (64, 1024))
    # Power-of-two rows up to the bucket, in each of the 10 widths (1 ... 512 blocks), 4 bytes a logit.
    assert small == sum(1 << n for n in range(7)) * 10 * SMOLLM2_VOCAB * 4
    assert large == sum(1 << n for n in range(11)) * 10 * SMOLLM2_VOCAB * 4
    joined = graph_outputs_bytes(1024, SMOLLM2_BLOCKS, SMOLLM2_VOCAB, 1, 1024, 8192, joined=True)
    assert joined > large


@pytest.mark.parametrize("max_batch_size", [256, 512, 1024])
def test_large_batches_start_on_an_80_gb_card(max_batch_size):
    plan = smollm2_plan(max_batch_size)
    plan.check(bytes_per_block=2 * 30 * 3 * 64 * 2 * 16, max_batch_size=max_batch_size)  # SmolLM2 bfloat16
    assert plan.pool_bytes > 40 << 30


def test_a_batch_that_cannot_fit_is_refused_with_the_numbers():
    plan = smollm2_plan(1024, total_gib=16.0)
    with pytest.raises(ConfigError) as refused:
        plan.check(bytes_per_block=2 * 30 * 3 * 64 * 2 * 16, max_batch_size=1024)
    message = str(refused.value)
    for part in ("max_batch_size=1024", "weights", "largest prompt forward", "decode graphs", "KV pool",
                 "kv_cache_free_gpu_mem_fraction"):
        assert part in message
