"""Prompts prefilled as single-query rows of the decode step (the path CUDA graphs take: a prompt's prefill becomes
a graph replay), run here on CPU with the same bucketed static inputs: the greedy tokens equal those of prompts
prefilled in forwards of their own, with cached prefixes and other requests decoding beside them."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded.model_loading import load_model
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.transformers_executor import TransformersExecutor

MAX_TOKENS = 6
HEADER = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3437, 15362, 28, 7018, 411, 407, 19712, 20840,
          30, 2, 198, 1, 4093, 198]  # SmolLM2's chat header, shared by every prompt below (cached after the first)
PROMPTS = [HEADER + [1000 + 37 * i + j for j in range(3 + 5 * i)] for i in range(6)]


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


def outputs(executor: TransformersExecutor) -> list[list[int]]:
    """Two prompts alone, then four together while a long request decodes: prefills meet decoding rows."""
    runs = run_all(executor, [GenerationRequest(input_ids=p, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS)
                              for p in PROMPTS[:2]])
    background = executor.enqueue(GenerationRequest(input_ids=PROMPTS[0], max_tokens=40, min_tokens=40))
    runs += run_all(executor, [GenerationRequest(input_ids=p, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS)
                               for p in PROMPTS[2:]])
    executor.cancel(background)
    results = [[token for step in steps for token in step.token_ids] for steps in runs]
    assert all(steps[-1].error is None for steps in runs)
    return results


def test_prompts_prefilled_in_the_decode_step_give_the_tokens_of_their_own_prefill(loaded):
    apart = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8)
    try:
        expected = outputs(apart)
    finally:
        apart.shutdown()

    folded = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8)
    runner = folded.runner
    runner.static_shapes, runner.graphs.max_rows = True, 256  # as after capture_decode_graphs on CUDA
    calls = {"prefill rows": 0, "apart": 0}
    decode, prefill = runner.decode, runner.prefill

    def counting_decode(sequences, prefills=()):
        calls["prefill rows"] += sum(sequence.prefill_len for sequence in prefills)
        return decode(sequences, prefills)

    def counting_prefill(sequences):
        calls["apart"] += len(sequences)
        return prefill(sequences)

    runner.decode, runner.prefill = counting_decode, counting_prefill
    try:
        got = outputs(folded)
    finally:
        folded.shutdown()
    assert calls["apart"] == 0 and calls["prefill rows"] > 0, calls
    assert got == expected


def test_prompts_whose_decode_step_fails_are_prefilled_apart_and_served(loaded):
    """A forward with prompts in it that raises (theirs, as the decode alone then succeeds) costs nobody a token."""
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8)
    runner = executor.runner
    runner.static_shapes, runner.graphs.max_rows = True, 256
    decode = runner.decode
    failed = []

    def failing_with_prompts(sequences, prefills=()):
        if prefills:
            failed.append(len(prefills))
            raise RuntimeError("injected")
        return decode(sequences, prefills)

    runner.decode = failing_with_prompts
    try:
        steps = run_all(executor, [GenerationRequest(input_ids=p, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS)
                                   for p in PROMPTS[:3]])
    finally:
        executor.shutdown()
    assert failed
    assert [len([t for step in s for t in step.token_ids]) for s in steps] == [MAX_TOKENS] * 3
    assert all(s[-1].error is None for s in steps)
