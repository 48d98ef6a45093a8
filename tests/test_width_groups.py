"""A CPU decode step whose rows' contexts differ a lot goes in several forwards (`runner.width_groups`): one long
context no longer makes every row gather its width. Over SmolLM2 on CPU: the rows' logits land in their own rows
(the same greedy tokens as one padded forward), and the split is the one that gathers least."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.runner import width_groups
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.transformers_executor import TransformersExecutor


def test_a_long_table_among_short_ones_goes_alone_and_similar_ones_stay_together():
    assert width_groups([3, 128, 2, 3, 2], forward_cost=100) == [[1], [0, 3, 2, 4]]
    assert width_groups([30, 28, 31, 29], forward_cost=100) == [[0, 1, 2, 3]]
    # Two long and many short: the long ones share a forward.
    assert width_groups([100, 2, 90, 2, 2, 2, 2, 2], forward_cost=50) == [[0, 2], [1, 3, 4, 5, 6, 7]]
    # Padding that wastes less than a forward: one forward, whatever the spread.
    assert width_groups([40, 1], forward_cost=50) == [[0, 1]]


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


def test_rows_decoded_in_several_forwards_get_the_tokens_of_one_padded_forward(loaded):
    requests = [GenerationRequest(input_ids=[1, 300 + 7 * i] * (1 + 20 * (i % 3 == 0)), max_tokens=12, end_id=-1)
                for i in range(6)]  # contexts of 2, and of 42 tokens (3 blocks) for every third
    padded = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8)
    padded.runner._forward_cost_blocks = float("inf")  # never split
    try:
        expected = [[t for step in steps for t in step.token_ids] for steps in run_all(padded, requests)]
    finally:
        padded.shutdown()
    split = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8)
    split.runner._forward_cost_blocks = 1.0  # split whenever padding gathers more than one block
    forward, calls = split.runner._forward, []
    split.runner._forward = lambda inputs: calls.append(inputs.input_ids.shape[0]) or forward(inputs)
    try:
        got = [[t for step in steps for t in step.token_ids] for steps in run_all(split, requests)]
    finally:
        split.shutdown()
    assert got == expected
    assert 2 in calls, calls  # the two 3-block rows decoded in a forward of their own
