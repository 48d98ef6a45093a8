"""The prefill share of a step (embedded/step_budget.py): steered from step times so that a step with a prompt chunk
takes about `stall_factor` times a decode-only step."""

from __future__ import annotations

from trtllm_model.embedded.step_budget import FIRST_CHUNK, MIN_CHUNK, StepBudget


def run(budget: StepBudget, cost, steps: int = 30, decode_s: float = 0.1) -> list[int]:
    """Decode-only steps, then `steps` steps that prefill the chunk the budget hands out at `cost(tokens)` seconds;
    returns the chunks handed out."""
    for _ in range(5):
        budget.observe(decoding=16, prompt_tokens=0, seconds=decode_s)
    chunks = []
    for _ in range(steps):
        tokens = budget.prefill_tokens(decoding=16)
        chunks.append(tokens)
        budget.observe(decoding=16, prompt_tokens=tokens, seconds=decode_s + cost(tokens))
    return chunks


def test_off_or_before_any_decode_only_step_a_step_may_prefill_its_whole_budget():
    assert StepBudget(2048, stall_factor=0).prefill_tokens(decoding=16) == 2032
    assert StepBudget(2048, stall_factor=2.5).prefill_tokens(decoding=0) == 2048


def test_with_nothing_decoding_a_step_prefills_the_same_bounded_chunk():
    """A prompt prefilling alone: a request arriving meanwhile waits for a step of about the stall factor times a
    decode-only step, not for a 2,048-token chunk."""
    budget = StepBudget(2048, stall_factor=2.5)
    run(budget, lambda n: 0.0025 * n)
    assert budget.prefill_tokens(decoding=0) == budget.chunk < 100
    for _ in range(10):  # prompt steps alone cost what a decode step does plus their tokens
        budget.observe(decoding=0, prompt_tokens=budget.chunk, seconds=0.1 + 0.0025 * budget.chunk)
    assert abs(budget.prefill_tokens(decoding=0) - 60) <= 1


def test_the_first_chunk_is_small_then_it_settles_where_the_step_takes_the_stall_factor():
    # CPU-like: 2.5 ms a prompt token, 100 ms a decode step: (2.5 - 1) x 100 ms / 2.5 ms = 60 tokens a step.
    chunks = run(StepBudget(2048, stall_factor=2.5), lambda n: 0.0025 * n)
    assert chunks[0] == FIRST_CHUNK and abs(chunks[-1] - 60) <= 1


def test_a_chunk_that_grows_dearer_with_its_prefix_is_followed():
    dearer = iter(range(1000))
    chunks = run(StepBudget(2048, stall_factor=3.0), lambda n: 0.001 * n * (1 + next(dearer) / 10), steps=40)
    assert chunks[-1] < chunks[10] / 2


def test_one_noisy_step_moves_the_chunk_at_most_by_half_or_double():
    budget = StepBudget(2048, stall_factor=2.5)
    run(budget, lambda n: 0.001 * n)
    settled = budget.chunk  # 150
    budget.observe(decoding=16, prompt_tokens=settled, seconds=50.0)  # the machine stalled once
    after_stall = budget.chunk
    assert after_stall == settled // 2
    budget.observe(decoding=16, prompt_tokens=after_stall, seconds=0.1)  # then a step cost nothing
    assert budget.chunk == 2 * after_stall


def test_never_below_the_minimum_nor_above_the_budget():
    assert run(StepBudget(2048, stall_factor=2.5), lambda n: 1.0 * n)[-1] == MIN_CHUNK
    assert run(StepBudget(2048, stall_factor=2.5), lambda n: 1e-7 * n)[-1] == 2048 - 16
