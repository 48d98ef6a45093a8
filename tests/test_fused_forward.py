"""Fused forwards (issue 33 item 2, embedded/fused_forward.py), on CPU: decode steps and prompt chunks run as the fused
pieces give the greedy tokens and log probs of transformers' own forward, for SmolLM2 with and without the graphs'
bucketed static inputs (padding rows, prompts prefilled as rows of the step); compiled by inductor, the pieces trace
whole, match their uncompiled selves, and one graph serves every layer; the engine's warm-up of the prompt shapes
writes only the trash block. Only plain Llama layers are taken."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from trtllm_model.embedded import fused_forward
from trtllm_model.embedded.block_manager import TRASH_BLOCK
from trtllm_model.embedded.decode_graphs import DecodeGraphs, JoinedBuckets
from trtllm_model.embedded.fused_forward import FusedForward
from trtllm_model.embedded.kv_cache import StepInputs
from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.executor_interface import GenerationRequest, Step
from trtllm_model.executors.transformers_executor import PARAMETERS, TransformersExecutor, create
from trtllm_model.params import ConfigError, Params

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?",
             "List three primary colors.", "Name a famous painting."]


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


def tiny_llama(layers: int, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **overrides)
    return LlamaForCausalLM(config).eval()


def answers(executor: TransformersExecutor, prompts: list[list[int]], max_tokens: int) -> list[tuple]:
    """Greedy answers with log probs; two prompts go first, the rest once those two decode (prefills meet decoding
    rows)."""
    requests = [GenerationRequest(input_ids=p, max_tokens=max_tokens, min_tokens=max_tokens, return_log_probs=True)
                for p in prompts]
    ids = [executor.enqueue(request) for request in requests[:2]]
    steps: dict[int, list[Step]] = {request_id: [] for request_id in ids}
    deadline = time.monotonic() + 300
    # Until every prompt is in and done: on a fast machine the first two can finish within one await, before the
    # rest went in (they then prefill alone; the answers must still match).
    while len(ids) < len(prompts) or not all(s and s[-1].is_final for s in steps.values()):
        assert time.monotonic() < deadline, "requests did not finish in time"
        if len(ids) == 2 and all(steps[request_id] for request_id in ids):
            ids += [executor.enqueue(request) for request in requests[2:]]
            steps.update({request_id: [] for request_id in ids[2:]})
        for step in executor.await_steps(1.0):
            steps[step.request_id].append(step)
    runs = [steps[request_id] for request_id in ids]
    assert len(runs) == len(prompts) and all(s[-1].error is None for s in runs)
    return [([t for s in run for t in s.token_ids], [p for s in run for p in s.log_probs]) for run in runs]


def run_with(model: torch.nn.Module, tokenizer, prompts: list[list[int]], max_tokens: int,
             fused: FusedForward | None, static_shapes: bool = False,
             joined: JoinedBuckets | None = None) -> tuple[list[tuple], list[list[tuple]]]:
    """The answers, and the fused forwards' parts' shapes (rows, queries), forward by forward."""
    executor = TransformersExecutor(model, tokenizer, max_batch_size=8, fused_forward=False)
    runner = executor.runner
    if static_shapes:
        runner.static_shapes, runner.graphs.max_rows = True, 256  # as after capture_decode_graphs on CUDA
    runner.graphs.joined = joined
    calls = []
    if fused is not None:
        def counting(parts, pool, ends=None):
            calls.append([tuple(part.input_ids.shape) for part in parts])
            return fused(parts, pool, ends)
        runner.fused_forward = counting
    try:
        return answers(executor, prompts, max_tokens), calls
    finally:
        executor.shutdown()


def assert_same_answers(got: list[tuple], expected: list[tuple], tolerance: float) -> None:
    for (tokens, log_probs), (expected_tokens, expected_log_probs) in zip(got, expected):
        assert tokens == expected_tokens
        assert max(abs(a - b) for a, b in zip(log_probs, expected_log_probs)) < tolerance


@pytest.mark.parametrize("static_shapes", [False, True], ids=["rows as they are", "bucketed like the graphs"])
def test_fused_steps_give_the_tokens_and_log_probs_of_transformers_forward(loaded, static_shapes):
    template = loaded.tokenizer.apply_chat_template
    prompts = [loaded.tokenizer.encode(template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                tokenize=False)) for q in QUESTIONS]
    expected, _ = run_with(loaded.model, loaded.tokenizer, prompts, 16, None, static_shapes)
    got, calls = run_with(loaded.model, loaded.tokenizer, prompts, 16, FusedForward(loaded.model, compile=False),
                          static_shapes)
    assert len(calls) >= 15
    assert_same_answers(got, expected, 1e-4)
    # The three later prompts met decoding rows: without static shapes in one forward as a part of their own (a
    # chunk, several queries a row); bucketed like the graphs as single-query rows.
    mixed = [shapes for shapes in calls if len(shapes) > 1 and any(queries > 1 for _, queries in shapes)]
    assert bool(mixed) != static_shapes, calls


@pytest.mark.parametrize("fused", [False, True], ids=["transformers' forward", "fused"])
def test_prompt_tokens_beyond_the_power_of_two_buckets_give_the_tokens_and_log_probs_of_their_own_prefill(
        loaded, fused):
    """The joined buckets (`decode_graphs.JoinedBuckets`: beyond 16 rows here), as a burst of new requests' prompts
    takes them on CUDA: rows padded to `padded_count` sizes, each table 32 blocks wide, the head over the 8 sequences'
    last rows only."""
    template = loaded.tokenizer.apply_chat_template
    prompts = [loaded.tokenizer.encode(template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                tokenize=False)) for q in QUESTIONS]
    expected, _ = run_with(loaded.model, loaded.tokenizer, prompts, 8, None)
    forward = FusedForward(loaded.model, compile=False) if fused else None
    joined = JoinedBuckets(above=16, width=32, head_rows=8)
    got, calls = run_with(loaded.model, loaded.tokenizer, prompts, 8, forward, True, joined)
    assert_same_answers(got, expected, 1e-4)
    if fused:  # the first two prompts (over 16 tokens each) went in as rows of one step, padded to a joined size
        assert any(len(shapes) == 1 and shapes[0][1] == 1 and shapes[0][0] > 16
                   and shapes[0][0] == fused_forward.padded_count(shapes[0][0]) for shapes in calls), calls


def test_a_step_beyond_the_power_of_two_buckets_with_a_table_wider_than_theirs_is_not_taken_in_a_graph():
    runner = ModelRunner.__new__(ModelRunner)
    runner.graphs = DecodeGraphs(runner)
    runner.graphs.max_rows, runner.graphs.joined = 2048, JoinedBuckets(above=512, width=32, head_rows=256)
    assert runner.takes_in_graph(512, 400)  # a power-of-two bucket: any width
    assert runner.takes_in_graph(2048, 32)
    assert not runner.takes_in_graph(513, 33)
    assert not runner.takes_in_graph(2049, 1)


def test_compiled_pieces_trace_whole_match_their_uncompiled_selves_and_serve_every_layer():
    """Inductor on CPU (C++); a graph break would raise (fullgraph). A 2-layer and a 4-layer model compile the same
    number of graphs over the same forwards (decode rows, prompt chunks, both in one forward): the layers' weights
    are arguments, not guards. (Counted over fixed forwards: which steps an engine's requests share depends on
    timing.)"""
    prompts = [[5 + 7 * i + j for j in range(3 + 4 * i)] for i in range(4)]
    graphs = []
    for layers in (2, 4):
        model = tiny_llama(layers)
        expected, _ = run_with(model, None, prompts, 6, FusedForward(model, compile=False))
        got, calls = run_with(model, None, prompts, 6, FusedForward(model, compile=True))
        assert len(calls) >= 5
        assert_same_answers(got, expected, 1e-4)
        executor = TransformersExecutor(model, None, max_batch_size=2, kv_cache_memory_bytes=1 << 20,
                                        fused_forward=False)
        try:
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            compiled, block_size = FusedForward(model, compile=True), executor.runner.pool.block_size
            with torch.inference_mode():
                for parts in ([(3, 1)], [(1, 5)], [(2, 1)], [(1, 1)], [(4, 1), (1, 6)], [(1, 7)]):
                    compiled([trash_inputs(rows, queries, block_size) for rows, queries in parts],
                             executor.runner.pool)
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        finally:
            executor.shutdown()
    assert graphs[0] == graphs[1] > 0, graphs


def trash_inputs(rows: int, queries: int, block_size: int) -> StepInputs:
    """A forward's inputs whose every token is id 0 at position 0 of the trash block."""
    return StepInputs(torch.zeros((rows, queries), dtype=torch.long), torch.zeros((rows, queries), dtype=torch.long),
                      torch.full((rows * queries,), TRASH_BLOCK * block_size, dtype=torch.long),
                      torch.full((rows, 1), TRASH_BLOCK, dtype=torch.long))


def test_the_fused_norm_rounds_as_transformers_llama_norm_in_bfloat16():
    """Bit for bit: in bfloat16 one rounding more or less flips near-ties of the served tokens (a chat answer on a CPU
    with AVX512-BF16 was no longer transformers' own)."""
    torch.manual_seed(0)
    norm = LlamaRMSNorm(576, eps=1e-5).to(torch.bfloat16)
    norm.weight.data.normal_(1.0, 0.5)
    hidden = (torch.randn(64, 576) * 3).to(torch.bfloat16)
    assert torch.equal(fused_forward._rms_norm(hidden, norm.weight, 1e-5), norm(hidden))


def test_only_plain_llama_layers_are_fused(loaded):
    assert fused_forward.supports(loaded.model)
    assert fused_forward.supports(tiny_llama(1))
    assert not fused_forward.supports(tiny_llama(1, attention_bias=True))
    assert not fused_forward.supports(tiny_llama(1, mlp_bias=True))
    assert not fused_forward.supports(tiny_llama(1, hidden_act="gelu"))


def test_on_the_cpu_the_runner_fuses_eagerly_and_mixes_prompts_into_decode_steps_unless_asked_not_to(loaded):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=2)
    try:
        runner = executor.runner
        assert runner.fused_forward is not None and not runner.fused_forward.compiled
        assert runner.mixes_prompts and runner.warm_up_prefill(40, 2) is False  # nothing to compile
    finally:
        executor.shutdown()
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=2, fused_forward=False)
    try:
        assert executor.runner.fused_forward is None and not executor.runner.mixes_prompts
    finally:
        executor.shutdown()


def test_a_fused_forward_value_other_than_true_or_false_fails_the_load_naming_it():
    """Config only (no request reaches it); checked before the model loads."""
    with pytest.raises(ConfigError, match="fused_forward='sometimes': expected true or false"):
        create(Params({"fused_forward": "sometimes"}, PARAMETERS))


def test_the_prompt_forwards_warm_up_touches_only_the_trash_block():
    """The engine compiles the prompt forwards' shapes and runs their padded sizes before its first request; that
    must write no block a request may hold."""
    model = tiny_llama(2)
    executor = TransformersExecutor(model, None, max_batch_size=2, kv_cache_memory_bytes=1 << 20, fused_forward=False)
    try:
        runner = executor.runner
        assert runner.warm_up_prefill(40, 2) is False  # nothing to compile without fused forwards
        shapes = []

        class Recording(FusedForward):
            def __call__(self, parts, pool, ends=None):
                shapes.extend(tuple(part.input_ids.shape) for part in parts)
                return super().__call__(parts, pool, ends)

        runner.fused_forward = Recording(model, compile=False)
        runner.fused_forward.compiled = True  # as on CUDA, without inductor's compiles
        pool = runner.pool
        for tensor in (*pool.keys, *pool.values):
            tensor.normal_()
        before = [tensor.clone() for tensor in (*pool.keys, *pool.values)]
        assert runner.warm_up_prefill(40, 20) is True
        # The first compiles, then every padded token count up to 40 and every padded row count up to 20.
        assert shapes == [(1, 2), (1, 3), (2, 2), *((1, tokens) for tokens in [*range(4, 17), 18, 20, 22, 24, 26, 28,
                                                                                  30, 32, 36, 40]),
                          *((rows, 2) for rows in [*range(3, 17), 18, 20])]
        for tensor, old in zip((*pool.keys, *pool.values), before):
            assert torch.equal(tensor[TRASH_BLOCK + 1 :], old[TRASH_BLOCK + 1 :])
            assert not torch.equal(tensor[TRASH_BLOCK], old[TRASH_BLOCK])
    finally:
        executor.shutdown()


@pytest.mark.parametrize("compile", [False, True], ids=["uncompiled", "compiled"])
def test_a_prompt_forward_padded_to_its_bucket_gives_the_logits_and_writes_of_an_unpadded_one(monkeypatch, compile):
    """17 rows of 3 queries: 51 tokens go through the pieces as 52, and the head takes 18 rows; what comes back, and
    what lands in the pool, is what the same forward gives unpadded (compiled: inductor's C++ on the CPU)."""
    model = tiny_llama(2)
    executor = TransformersExecutor(model, None, max_batch_size=32, kv_cache_memory_bytes=1 << 22,
                                    fused_forward=False)
    try:
        pool = executor.runner.pool
        fused = FusedForward(model, compile=compile)
        fused.pads = True  # as on CUDA (eager pieces do not pad)
        rows, queries, block_size = 17, 3, pool.block_size
        assert fused_forward.padded_count(rows * queries) > rows * queries and fused_forward.padded_count(rows) > rows
        generator = torch.Generator().manual_seed(3)
        ids = torch.randint(1, 500, (rows, queries), generator=generator)
        positions = torch.arange(queries).repeat(rows, 1)
        tables = torch.arange(TRASH_BLOCK + 1, TRASH_BLOCK + 1 + rows)[:, None]  # a block of its own each
        slots = (tables * block_size + positions).reshape(-1)
        inputs = StepInputs(ids, positions, slots, tables)
        for tensor in (*pool.keys, *pool.values):
            tensor.zero_()
        with torch.inference_mode():
            padded = fused([inputs], pool)
            written = [tensor.clone() for tensor in (*pool.keys, *pool.values)]
            for tensor in (*pool.keys, *pool.values):
                tensor.zero_()
            monkeypatch.setattr(fused_forward, "padded_count", lambda count: count)
            unpadded = fused([inputs], pool)
        assert padded.shape == unpadded.shape == (rows, model.config.vocab_size)
        torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-5)
        for tensor, before in zip((*pool.keys, *pool.values), written):
            torch.testing.assert_close(tensor, before, rtol=1e-5, atol=1e-5)
        assert any(tensor.abs().sum() > 0 for tensor in pool.keys)  # the forward did write
    finally:
        executor.shutdown()


def test_a_prompts_first_chunk_attends_causally_and_gives_transformers_logits(loaded, monkeypatch):
    """One row from position 0 (a prompt's first chunk, eager) is attended with SDPA's causal flag, not a mask: the
    keys past its last query (the rest of its last block) stay out, and the chunk after it, at a prefix, still reads
    what it wrote."""
    text = "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill. " * 3
    prompt = loaded.tokenizer.encode(text)[:45]  # 45 tokens: the third block part-filled
    with torch.inference_mode():
        expected = loaded.model(torch.tensor([prompt])).logits[0].float()
        pool = ModelRunner(loaded.model).allocate_kv_pool(8, 16)

        def chunk(first_block: int, start: int, ids: list[int]) -> StepInputs:
            tables = torch.arange(-(-(start + len(ids)) // 16))[None] + first_block
            positions = torch.arange(start, start + len(ids))[None]
            return StepInputs(torch.tensor([ids]), positions, tables[0, positions[0] // 16] * 16 + positions[0] % 16,
                              tables)

        fused, causal = FusedForward(loaded.model, compile=False), []
        attention = torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda *args, **kwargs: causal.append(kwargs.get("is_causal", False)) or
                            attention(*args, **kwargs))
        whole = fused([chunk(1, 0, prompt)], pool)
        first = fused([chunk(4, 0, prompt[:32])], pool)
        rest = fused([chunk(4, 32, prompt[32:])], pool)
    layers = len(loaded.model.model.layers)
    assert causal == [True] * layers * 2 + [False] * layers
    for logits, position in ((whole, 44), (first, 31), (rest, 44)):
        assert (logits[0] - expected[position]).abs().max() < 1e-3
