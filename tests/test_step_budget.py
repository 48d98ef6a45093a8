"""The prefill share of a step (embedded/step_budget.py): learned from step times so that a step with a prompt chunk
takes at most `stall_factor` times a decode-only step, where chunking can keep that bound."""

from __future__ import annotations

import pytest

from trtllm_model.embedded.step_budget import MIN_CHUNK, StepBudget


def learned(fixed_s: float, per_token_s: float, decode_s: float, factor: float = 2.5) -> StepBudget:
    budget = StepBudget(max_num_tokens=2048, stall_factor=factor)
    for _ in range(20):
        budget.observe(decoding=16, prompt_tokens=0, seconds=decode_s)
    for tokens in (16, 64, 32, 128, 48, 96) * 3:
        budget.observe(decoding=16, prompt_tokens=tokens, seconds=decode_s + fixed_s + per_token_s * tokens)
    return budget


def test_off_or_with_nothing_decoding_a_step_may_prefill_its_whole_budget():
    assert StepBudget(2048, stall_factor=0).prefill_tokens(decoding=16) == 2032
    budget = learned(0.0, 0.005, 0.1)
    assert budget.prefill_tokens(decoding=0) == 2048


def test_a_compute_bound_prefill_gets_the_chunk_that_keeps_the_stall_factor():
    # CPU-like: 5 ms a prompt token, 100 ms a decode step: (2.5 - 1) x 100 ms / 5 ms = 30 tokens a step.
    assert learned(0.0, 0.005, 0.1).prefill_tokens(decoding=16) == pytest.approx(30, abs=1)
    # A fixed cost counts against the room: (150 - 50) ms / 5 ms = 20.
    assert learned(0.05, 0.005, 0.1).prefill_tokens(decoding=16) == pytest.approx(20, abs=1)


def test_where_no_chunk_can_keep_the_bound_the_full_budget_is_used():
    # GPU-like eager prefill: 30 ms of launches whatever the size, 10 ms a decode step: chunking cannot help.
    assert learned(0.03, 0.00001, 0.01).prefill_tokens(decoding=256) == 2048 - 256


def test_before_any_prefill_beside_decoding_a_small_first_chunk_and_never_below_the_minimum():
    budget = StepBudget(2048, stall_factor=2.5)
    budget.observe(decoding=4, prompt_tokens=0, seconds=0.1)
    assert budget.prefill_tokens(decoding=4) == MIN_CHUNK * 4
    assert learned(0.0, 0.1, 0.1).prefill_tokens(decoding=16) == MIN_CHUNK  # 1.5 tokens' room: the minimum


def test_it_follows_a_machine_that_slows_down():
    budget = learned(0.0, 0.005, 0.1)
    before = budget.prefill_tokens(decoding=16)
    for tokens in (16, 64, 32, 128, 48, 96) * 3:  # prefill now twice as dear
        budget.observe(decoding=16, prompt_tokens=tokens, seconds=0.1 + 0.01 * tokens)
    assert budget.prefill_tokens(decoding=16) < before * 0.7
