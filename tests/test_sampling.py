"""The embedded engine's sampling (trtllm_model/embedded/sampling.py): sampling rows are cut and drawn together for the
whole batch; these check what each row gets against its own settings, whatever shares the batch."""

from __future__ import annotations

import math
import random

import torch

from trtllm_model.embedded.sampling import SamplingParams, SamplingState, sample_next_tokens


def state(seed: int, greedy: bool = False, **settings) -> SamplingState:
    params = SamplingParams(greedy=greedy, log_probs=True, **settings)
    return SamplingState(params=params, generator=random.Random(seed), token_ids=[1], output_counts={},
                         num_output=0, end_id=None)


def logits_rows(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 3.0


def test_each_row_keeps_to_its_own_top_k_top_p_and_temperature():
    logits = logits_rows(4, 1000)
    for seed in range(40):
        states = [state(seed, top_k=5), state(seed + 1, top_p=0.3), state(seed + 2, top_k=50, top_p=0.5),
                  state(seed + 3, temperature=0.5)]
        tokens, log_probs, _ = sample_next_tokens(logits, states)
        order = logits.argsort(-1, descending=True)
        assert tokens[0] in order[0, :5].tolist()
        probs = torch.softmax(logits[1], -1)[order[1]]
        nucleus = int(((probs.cumsum(0) - probs) < 0.3).sum())
        assert tokens[1] in order[1, :nucleus].tolist()
        top = torch.softmax(logits[2][order[2, :50]], -1)  # within top-k, top-p of the renormalised distribution
        assert tokens[2] in order[2, : int(((top.cumsum(0) - top) < 0.5).sum())].tolist()
        for row, temperature in enumerate([1.0, 1.0, 1.0, 0.5]):
            expected = torch.log_softmax(logits[row] / temperature, -1)[tokens[row]]
            assert math.isclose(log_probs[row], float(expected), abs_tol=1e-4)


def test_draws_follow_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    counts = torch.zeros(5)
    for seed in range(4000):
        (token,), _, _ = sample_next_tokens(logits, [state(seed, temperature=1.0)])
        counts[token] += 1
    expected = torch.softmax(logits[0], -1)
    assert torch.allclose(counts / counts.sum(), expected, atol=0.03), (counts / counts.sum(), expected)
    assert counts[4] == 0


def test_a_seeded_row_draws_the_same_alone_and_in_a_crowd():
    logits = logits_rows(6, 500, seed=3)
    alone = [sample_next_tokens(logits[2:3], [state(7, top_p=0.9)])[0][0] for _ in range(1)]
    crowd_states = [state(100 + row, top_k=3) for row in range(6)]
    crowd_states[2] = state(7, top_p=0.9)
    crowd = sample_next_tokens(logits, crowd_states)[0]
    assert crowd[2] == alone[0]


def test_a_top_p_beyond_the_first_candidates_still_samples_inside_the_nucleus():
    logits = torch.zeros((1, 5000))  # flat: the best 256 tokens hold 5 % of the probability
    logits[0, 4000:] = -50.0
    for seed in range(20):
        (token,), _, _ = sample_next_tokens(logits, [state(seed, top_p=0.9)])
        assert token < 4000


def test_greedy_and_sampling_rows_together_and_an_all_banned_row():
    logits = logits_rows(3, 100)
    logits[2] = float("-inf")
    tokens, log_probs, _ = sample_next_tokens(logits, [state(0, greedy=True), state(1, top_k=2), state(2, top_k=2)])
    assert tokens[0] == int(logits[0].argmax())
    assert tokens[1] in logits[1].argsort(descending=True)[:2].tolist()
    assert log_probs[2] == float("-inf")


def test_extreme_client_settings_still_give_a_token_of_the_vocabulary():
    """Values a client may send (temperature near 0 or huge, top_p near 0, top_k near the vocabulary) never fail
    the batch nor give a token outside the vocabulary; near-zero temperature is the greedy token."""
    logits = logits_rows(6, 1000, seed=5)
    settings = [{"temperature": 1e-30}, {"temperature": 3.4e38}, {"top_p": 1e-9}, {"top_k": 999},
                {"top_k": 999, "top_p": 1e-9, "temperature": 1e-20}, {"temperature": 1e30}]
    tokens, log_probs, _ = sample_next_tokens(logits, [state(i, **s) for i, s in enumerate(settings)])
    assert all(0 <= token < 1000 for token in tokens)
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())
    assert all(not math.isnan(value) for value in log_probs)


def test_top_log_probs_come_from_the_sampled_distribution_and_hold_the_chosen_token():
    """The likeliest tokens (OpenAI's top_logprobs) under the distribution each row was drawn from: greedy the logits
    as they are, sampled after temperature; the chosen token's log prob is its entry's, exactly."""
    logits = logits_rows(3, 500, seed=3)
    states = [state(0, greedy=True, top_log_probs=5), state(1, temperature=0.7, top_log_probs=20), state(2)]
    tokens, log_probs, tops = sample_next_tokens(logits, states)
    assert tops[2] is None and [len(tops[0]), len(tops[1])] == [5, 20]
    for row, temperature in ((0, 1.0), (1, 0.7)):
        expected = torch.log_softmax(logits[row] / temperature, -1).topk(len(tops[row]))
        assert [i for i, _ in tops[row]] == expected.indices.tolist()
        assert all(math.isclose(v, e, abs_tol=1e-5) for (_, v), e in zip(tops[row], expected.values.tolist()))
        entries = dict(tops[row])
        if tokens[row] in entries:
            assert log_probs[row] == entries[tokens[row]]
    assert tops[0][0] == (tokens[0], log_probs[0])  # greedy: the likeliest is the chosen one
