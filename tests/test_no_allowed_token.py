"""A request whose guide, bans and bias leave no token allowed fails alone (issue 31): its own client error, never a
token its grammar refuses, never the engine's death, however many such requests come in a row."""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded.guided import GuideCompiler, mask_guided_logits
from trtllm_model.embedded.model_loading import load_model
from trtllm_model.embedded.sampling import NO_ALLOWED_TOKEN, SamplingParams, SamplingState, sample_next_tokens
from trtllm_model.executor_interface import FinishReason, GenerationRequest
from trtllm_model.executors.transformers_executor import TransformersExecutor

VOCAB = 49152
DIGIT = ("regex", "[0-9]")


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.fixture(scope="module")
def executor(loaded):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=8)
    yield executor
    executor.shutdown()


def allowed_first_tokens(tokenizer, guide_type: str, guide: str) -> list[int]:
    """The tokens the guide allows first (what a client must ban to leave none)."""
    compiler = GuideCompiler(tokenizer, VOCAB, [tokenizer.eos_token_id])
    logits = torch.zeros(1, VOCAB)
    mask_guided_logits(logits, [compiler.matcher(compiler.compile(guide_type, guide), None)])
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def guided(prompt: list[int], **kwargs) -> GenerationRequest:
    return GenerationRequest(input_ids=prompt, max_tokens=4, guided_decoding_type=DIGIT[0],
                             guided_decoding_guide=DIGIT[1], **kwargs)


def test_twelve_guided_requests_banning_every_allowed_token_each_fail_alone(executor, loaded):
    digits = allowed_first_tokens(loaded.tokenizer, *DIGIT)
    assert 0 < len(digits) < 20
    bias = [0.0] * VOCAB
    for token in digits:
        bias[token] = float("-inf")
    refused = [guided([1, 504 + i], bad_words=[[t] for t in digits]) for i in range(6)]
    refused += [guided([1, 604 + i], embedding_bias=bias) for i in range(6)]
    plain = GenerationRequest(input_ids=[1, 504], max_tokens=3, min_tokens=3)
    # One after another (what the failures-in-a-row rule counted), then a batch that mixes them with others.
    for request in refused:
        (steps,) = run_all(executor, [request])
        assert [step.token_ids for step in steps] == [[]], "a token the guide or the bans refuse"
        assert steps[-1].is_final and steps[-1].finish_reason is FinishReason.ERROR and steps[-1].client_error
        assert "no token is allowed" in steps[-1].error
    together = run_all(executor, [plain, refused[0], guided([1, 504]), refused[-1]])
    assert [step.client_error for step in (together[1][-1], together[3][-1])] == [True, True]
    assert together[0][-1].error is None and len([t for s in together[0] for t in s.token_ids]) == 3
    answer = "".join(loaded.tokenizer.decode(s.token_ids) for s in together[2])
    assert together[2][-1].error is None and answer.isdigit(), answer
    assert executor.health_error() is None
    blocks = executor.engine.blocks
    assert blocks.free_blocks == blocks.num_blocks


def test_sampling_marks_rows_whose_bans_leave_nothing_and_only_those():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    banned_all = SamplingParams(greedy=True, banned_tokens=list(range(50)))
    biased_all = SamplingParams(greedy=False, top_k=5, embedding_bias=torch.full((50,), float("-inf")))
    free = SamplingParams(greedy=True, banned_tokens=[int(logits[1].argmax())])
    states = [SamplingState(params, random.Random(0), [1], {}, 0, None) for params in (banned_all, free, biased_all)]
    tokens, _, _ = sample_next_tokens(logits, states)
    assert tokens[0] == NO_ALLOWED_TOKEN and tokens[2] == NO_ALLOWED_TOKEN
    assert tokens[1] == int(logits[1].topk(2).indices[1])
