"""Overlapped steps (issue 33 item 1), over SmolLM2 on CPU with `overlap_steps` forced on: the engine launches step
n+1 before the host reads step n's tokens (fed to it from the device's tensor). Whatever ends a request (its length,
its end id, a stop word, a cancel), a request gets the tokens and log probs of plain steps; seeded sampling draws the
same; requests whose sampling needs the host's tokens (penalties) are stepped plainly beside overlapped ones;
preemption and the graphs' static inputs give the same tokens; every block comes back. Each holds with one step an
iteration and with several greedy steps launched at once (`decode_steps`: each step fed the last one's argmax on the
device, their tokens read together)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from engine_helpers import run_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.executor_interface import FinishReason, GenerationRequest, Step
from trtllm_model.executors.transformers_executor import TransformersExecutor


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.fixture(scope="module")
def plain(loaded):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, overlap_steps=False)
    yield executor
    executor.shutdown()


@pytest.fixture(scope="module", params=[1, 4], ids=["one-step", "four-steps"])
def overlapped(loaded, request):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, overlap_steps=True,
                                    decode_steps=request.param)
    yield executor
    executor.shutdown()


@contextlib.contextmanager
def counting_fed_steps(executor: TransformersExecutor) -> Iterator[dict[str, int]]:
    """Count the decode launches that fed a token from the device ("fed"; the runner's decode and decode_greedy,
    wrapped for the block) and the launches of several greedy steps ("greedy")."""
    counts = {"fed": 0, "all": 0, "greedy": 0}
    runner = executor.runner
    decode, decode_greedy = runner.decode, runner.decode_greedy

    def counting(sequences, prefills=(), fed=None):
        counts["all"] += 1
        counts["fed"] += any(sequence.pending for sequence in sequences)
        return decode(sequences, prefills, fed) if fed is not None else decode(sequences, prefills)

    def counting_greedy(sequences, fed, steps, end_ids, bans):
        counts["all"] += 1
        counts["greedy"] += 1
        counts["fed"] += any(sequence.pending for sequence in sequences)
        return decode_greedy(sequences, fed, steps, end_ids, bans)

    runner.decode, runner.decode_greedy = counting, counting_greedy
    try:
        yield counts
    finally:
        del runner.decode, runner.decode_greedy


def assert_greedy_steps(executor: TransformersExecutor, counts: dict[str, int]) -> None:
    """With several decode steps an iteration, some greedy ones were launched at once; with one, none."""
    if executor.engine.config.decode_steps > 1:
        assert counts["greedy"] > 0
    else:
        assert counts["greedy"] == 0


def outcome(steps: list[Step]) -> tuple:
    """What a client sees of a request: tokens, log probs, how it ended (exactly one final step, the last)."""
    assert [step.is_final for step in steps].count(True) == 1 and steps[-1].is_final
    log_probs = [p for step in steps for p in (step.log_probs or [])]
    return [t for step in steps for t in step.token_ids], log_probs, steps[-1].finish_reason, steps[-1].error


def assert_same(runs: list[list[Step]], expected: list[tuple]) -> None:
    """Tokens and endings equal; log probs to 1e-4: a step's rows are not the same set with and without overlap (a
    row is fed after its request ended on a token not yet read), and the CPU's matmuls round with the batch size."""
    got = [outcome(steps) for steps in runs]
    assert [(tokens, end, error) for tokens, _, end, error in got] == [(t, end, e) for t, _, end, e in expected]
    for (_, log_probs, *_), (_, reference, *_) in zip(got, expected):
        assert log_probs == pytest.approx(reference, abs=1e-4)


def assert_pool_empty(executor: TransformersExecutor) -> None:
    blocks = executor.engine.blocks
    assert blocks.free_blocks == blocks.num_blocks
    assert not executor.engine.in_flight


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(200, 40000), min_size=1, max_size=12), st.integers(1, 10)),
                min_size=2, max_size=4))
def test_greedy_requests_get_the_tokens_of_plain_steps_however_they_end(plain, overlapped, requests):
    reference = [outcome(s) for s in run_all(plain, [GenerationRequest(input_ids=p, max_tokens=n) for p, n in requests])]
    # Second round: each request also ends on a token it produced (an end id or a stop word), mid-batch.
    ending = []
    for index, ((prompt, max_tokens), (tokens, *_)) in enumerate(zip(requests, reference)):
        request = GenerationRequest(input_ids=prompt, max_tokens=max_tokens, return_log_probs=True)
        if len(tokens) > 2 and index % 2:
            request.end_id = tokens[len(tokens) // 2]
        elif len(tokens) > 2:
            request.stop_words = [[tokens[1]]]
        ending.append(request)
    every = [GenerationRequest(input_ids=p, max_tokens=n) for p, n in requests] + ending
    expected = [outcome(s) for s in run_all(plain, every)]
    with counting_fed_steps(overlapped) as counts:
        assert_same(run_all(overlapped, every), expected)
    if max(n for _, n in requests) > 2:
        assert counts["fed"] > 0
    assert_pool_empty(overlapped)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static-inputs"])
def test_greedy_steps_give_the_tokens_of_plain_steps_however_requests_end(loaded, plain, static):
    """Greedy requests ending at their length (some within one launch of four steps), on their end id and on a stop
    word: the tokens of plain steps, with four greedy steps launched at once whenever the batch only decodes. `static`: the graphs' bucketed inputs, advanced in place (the path CUDA replays)."""
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, overlap_steps=True,
                                    decode_steps=4)
    if static:
        executor.runner.static_shapes, executor.runner.graphs.max_rows = True, 256  # as after capture on CUDA
    try:
        base = [GenerationRequest(input_ids=[1, 800 + 7 * i, 31], max_tokens=[1, 2, 3, 5, 17, 30][i]) for i in range(6)]
        reference = [outcome(steps) for steps in run_all(plain, base)]
        # The same prompts ending on a token they produce: an end id, a stop word of two tokens, and an end id
        # banned (on the device) until 8 outputs.
        ending = [GenerationRequest(input_ids=base[5].input_ids, max_tokens=30, end_id=reference[5][0][9]),
                  GenerationRequest(input_ids=base[4].input_ids, max_tokens=30, stop_words=[reference[4][0][6:8]]),
                  GenerationRequest(input_ids=base[5].input_ids, max_tokens=12, min_tokens=8,
                                    end_id=reference[5][0][1]),
                  # What a client may send at the edges: the vocabulary's last id, min_tokens far past max_tokens.
                  GenerationRequest(input_ids=base[3].input_ids, max_tokens=7, min_tokens=10**9,
                                    end_id=plain.vocab_size - 1)]
        requests = [*base, *ending]
        expected = [outcome(steps) for steps in run_all(plain, requests)]
        assert [end for _, _, end, _ in expected[-4:-2]] == [FinishReason.END_ID, FinishReason.STOP_WORDS]
        assert len(expected[-2][0]) >= 8 and len(expected[-1][0]) == 7
        with counting_fed_steps(executor) as counts:
            assert_same(run_all(executor, requests), expected)
        assert counts["greedy"] > 0
        assert_pool_empty(executor)
    finally:
        executor.shutdown()


def test_seeded_sampling_draws_the_same_with_overlapped_steps(plain, overlapped):
    requests = [GenerationRequest(input_ids=[1, 504 + i, 29, 7 * i + 3], max_tokens=12 + 3 * i, temperature=0.9,
                                  top_k=[0, 40, 0][i % 3], top_p=[0.9, 1.0, 0.0][i % 3], seed=100 + i,
                                  return_log_probs=True)
                for i in range(6)]
    expected = [outcome(steps) for steps in run_all(plain, requests)]
    assert_same(run_all(overlapped, requests), expected)
    assert_pool_empty(overlapped)


def test_requests_whose_sampling_reads_their_tokens_are_stepped_plainly_beside_overlapped_ones(plain, overlapped):
    background = [GenerationRequest(input_ids=[1, 900 + i], max_tokens=30) for i in range(3)]
    reading = [GenerationRequest(input_ids=[1, 77, 78], max_tokens=10, repetition_penalty=1.3),
               GenerationRequest(input_ids=[1, 79], max_tokens=10, min_tokens=10, bad_words=[[13]])]
    expected = [outcome(steps) for steps in run_all(plain, [*background, *reading])]
    assert_same(run_all(overlapped, [*background, *reading]), expected)
    assert_pool_empty(overlapped)


def test_a_cancelled_request_ends_once_and_gives_its_blocks_back_with_overlapped_steps(overlapped):
    running = overlapped.enqueue(GenerationRequest(input_ids=[1, 2, 3], max_tokens=200, min_tokens=0))
    other = GenerationRequest(input_ids=[1, 4, 5], max_tokens=20)
    other_id = overlapped.enqueue(other)
    got: dict[int, list[Step]] = {running: [], other_id: []}
    while sum(len(s) for s in got.values()) < 6:
        for step in overlapped.await_steps(1.0):
            got[step.request_id].append(step)
    overlapped.cancel(running)
    while not all(s and s[-1].is_final for s in got.values()):
        for step in overlapped.await_steps(1.0):
            assert not got[step.request_id] or not got[step.request_id][-1].is_final, "a step after the final"
            got[step.request_id].append(step)
    assert outcome(got[running])[2] is FinishReason.CANCELLED
    (expected,) = run_all(overlapped, [other])
    assert_same([got[other_id]], [outcome(expected)])
    assert_pool_empty(overlapped)


@pytest.mark.parametrize("decode_steps", [1, 4])
def test_preempted_sequences_with_overlapped_steps_get_the_tokens_of_an_uninterrupted_run(loaded, plain, decode_steps):
    budget = 8 * 16 * ModelRunner(loaded.model).kv_bytes_per_token  # 8 blocks for 4 sequences of up to 48 tokens
    cramped = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, kv_cache_memory_bytes=budget,
                                   overlap_steps=True, decode_steps=decode_steps)
    try:
        # No end id (-1): each runs to its length, 3 blocks each, 12 against the pool's 8.
        requests = [GenerationRequest(input_ids=[1, 300 + 11 * i, 42], max_tokens=36 + i, end_id=-1) for i in range(4)]
        expected = [outcome(steps) for steps in run_all(plain, requests)]
        assert_same(run_all(cramped, requests), expected)
        assert cramped.engine.scheduler.preemptions > 0
        assert_pool_empty(cramped)
    finally:
        cramped.shutdown()


@pytest.mark.parametrize("decode_steps", [1, 4])
def test_overlapped_steps_on_the_graphs_static_inputs_give_the_same_tokens(loaded, plain, decode_steps):
    """The path CUDA takes: bucketed static inputs, prompts prefilled as rows of the decode step, tokens fed into the
    static input tensor, the steps after an iteration's first advanced on the device (run here on CPU)."""
    folded = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, overlap_steps=True,
                                  decode_steps=decode_steps)
    folded.runner.static_shapes, folded.runner.graphs.max_rows = True, 256  # as after capture_decode_graphs on CUDA
    try:
        requests = [GenerationRequest(input_ids=[1, 2, 600 + 13 * i] * (i + 1), max_tokens=9 + 2 * i) for i in range(5)]
        expected = [outcome(steps) for steps in run_all(plain, requests)]
        with counting_fed_steps(folded) as counts:
            assert_same(run_all(folded, requests), expected)
        assert counts["fed"] > 0
        assert_greedy_steps(folded, counts)
        assert_pool_empty(folded)
    finally:
        folded.shutdown()


def test_min_tokens_holds_on_the_device_with_overlapped_steps(plain, overlapped):
    base = [GenerationRequest(input_ids=[1, 700 + i, 15], max_tokens=12) for i in range(3)]
    reference = [outcome(steps) for steps in run_all(plain, base)]
    # Each request's own second token as its end id, banned until it has 8 outputs.
    requests = [GenerationRequest(input_ids=request.input_ids, max_tokens=12, min_tokens=8, end_id=tokens[1])
                for request, (tokens, *_) in zip(base, reference) if len(tokens) > 1]
    expected = [outcome(steps) for steps in run_all(plain, requests)]
    assert all(len(tokens) >= 8 for tokens, *_ in expected)
    with counting_fed_steps(overlapped) as counts:
        assert_same(run_all(overlapped, requests), expected)
    assert counts["fed"] > 0
    assert_greedy_steps(overlapped, counts)
    assert_pool_empty(overlapped)


def test_a_prompt_whose_prefill_fails_fails_alone_with_overlapped_steps(plain, overlapped, monkeypatch):
    """Prompts prefilled apart join the overlapped step's rows; one whose forward fails (its group's, then its own)
    ends with an error and the others, in its group and beside it, get the tokens of plain steps."""
    poison = 31337
    prefill = overlapped.runner.prefill

    def failing_prefill(sequences):
        if any(poison in sequence.token_ids for sequence in sequences):
            raise RuntimeError("simulated prefill failure")
        return prefill(sequences)

    # Lengths far apart: several prefill groups in one step, the poisoned prompt grouped with a healthy one.
    requests = [GenerationRequest(input_ids=[1, 40 + i] * length, max_tokens=6)
                for i, length in enumerate([2, 2, 9, 9, 30])]
    poisoned = GenerationRequest(input_ids=[1, poison] + [7] * 16, max_tokens=6)
    expected = [outcome(steps) for steps in run_all(plain, requests)]
    monkeypatch.setattr(overlapped.runner, "prefill", failing_prefill)
    *healthy, failed = run_all(overlapped, [*requests, poisoned])
    assert [step.is_final for step in failed] == [True]
    assert failed[-1].finish_reason is FinishReason.ERROR and "simulated prefill failure" in failed[-1].error
    assert_same(healthy, expected)
    assert_pool_empty(overlapped)
