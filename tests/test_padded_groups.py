"""Rows of different sizes split into padded forwards (`padded_groups`). A CPU decode step whose rows' contexts
differ a lot goes in several forwards: one long context no longer makes every row gather its width. Over SmolLM2 on
CPU: the rows' logits land in their own rows (the same greedy tokens as one padded forward), and the split is the one
that gathers least. Prompt chunks go in as few forwards as their padding allows (`scheduler.prefill_groups`)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.padded_groups import padded_groups
from trtllm_model.embedded.scheduler import prefill_groups
from trtllm_model.embedded.sequence import Sequence
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.transformers_executor import TransformersExecutor


def test_a_long_table_among_short_ones_goes_alone_and_similar_ones_stay_together():
    assert padded_groups([3, 128, 2, 3, 2], forward_cost=100) == [[1], [0, 3, 2, 4]]
    assert padded_groups([30, 28, 31, 29], forward_cost=100) == [[2, 0, 3, 1]]
    # Two long and many short: the long ones share a forward.
    assert padded_groups([100, 2, 90, 2, 2, 2, 2, 2], forward_cost=50) == [[0, 2], [1, 3, 4, 5, 6, 7]]
    # Padding that wastes less than a forward: one forward, whatever the spread.
    assert padded_groups([40, 1], forward_cost=50) == [[0, 1]]


def test_the_split_is_the_cheapest_of_all_splits():
    generator = random.Random(7)
    for _ in range(200):
        sizes = [generator.choice([1, 2, 5, 40, 41, 90, 128]) for _ in range(generator.randint(1, 7))]
        cost = generator.choice([0, 10, 100, 1000])
        ordered = sorted(sizes, reverse=True)

        best = min(cost * len(cuts) + cost + sum(  # every way to cut the largest-first order into runs
            (end - begin) * ordered[begin] for begin, end in zip((0, *cuts), (*cuts, len(ordered))))
            for count in range(len(ordered)) for cuts in itertools.combinations(range(1, len(ordered)), count))
        groups = padded_groups(sizes, cost)
        assert sorted(row for group in groups for row in group) == list(range(len(sizes)))
        got = sum(cost + len(group) * max(sizes[row] for row in group) for group in groups)
        assert got == best, (sizes, cost, groups)


def _chunk(tokens: int) -> Sequence:
    sequence = Sequence.from_request(tokens, GenerationRequest(input_ids=[1] * tokens, max_tokens=1), 100, None)
    sequence.prefill_end = tokens
    return sequence


def test_prompt_chunks_share_a_forward_unless_their_padding_costs_more_than_one():
    chunks = [_chunk(tokens) for tokens in (5, 120, 30, 118)]
    # A forward counted as 4,096 tokens (CUDA): 4 x 120 padded tokens is far cheaper than a second forward.
    assert [[s.prefill_len for s in group] for group in prefill_groups(chunks, 4096)] == [[120, 118, 30, 5]]
    # Counted as 64 tokens: the two long ones go together, the two short ones apart from them.
    assert [[s.prefill_len for s in group] for group in prefill_groups(chunks, 64)] == [[120, 118], [30, 5]]
    assert prefill_groups([], 64) == []


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.mark.parametrize("fused", [False, True], ids=["a forward a group", "groups attending apart in one forward"])
def test_rows_decoded_in_several_groups_get_the_tokens_of_one_padded_forward(loaded, fused):
    """Without fused forwards each group is a forward of its own; with them (the CPU's default) the groups are parts
    of one forward, whose logits come back in the rows' own order."""
    requests = [GenerationRequest(input_ids=[1, 300 + 7 * i] * (1 + 20 * (i % 3 == 0)), max_tokens=12, end_id=-1)
                for i in range(6)]  # contexts of 2, and of 42 tokens (3 blocks) for every third
    padded = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, fused_forward=fused)
    padded.runner._forward_cost_blocks = float("inf")  # never split
    try:
        expected = [[t for step in steps for t in step.token_ids] for steps in run_all(padded, requests)]
    finally:
        padded.shutdown()
    split = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8, fused_forward=fused)
    split.runner._forward_cost_blocks = 1.0  # split whenever padding gathers more than one block
    forward, calls = split.runner._forward, []
    split.runner._forward = lambda *parts: calls.append([part.input_ids.shape[0] for part in parts]) or forward(*parts)
    try:
        got = [[t for step in steps for t in step.token_ids] for steps in run_all(split, requests)]
    finally:
        split.shutdown()
    assert got == expected
    # The two 3-block rows decoded apart from the four others: in a forward of their own, or a part of their own.
    assert [2, 4] in calls if fused else [2] in calls, calls
