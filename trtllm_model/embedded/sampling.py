"""From one step's logits to one token per sequence, each with its own sampling settings and random generator.

Order, per row: embedding bias, repetition penalty (over prompt and output, as in Hugging Face), presence and
frequency penalties (over the output only, as in OpenAI's API), bans (bad words; the end id before min_tokens),
temperature; then top-k and top-p cut the distribution that is sampled. A log prob is that of the chosen token
under the distribution after temperature and before top-k/top-p; a request's top log probs (the likeliest tokens at
each position, OpenAI's top_logprobs) come from that same distribution, so the chosen token's entry among them is its
log prob exactly. A row whose guide, bans and bias leave no token
allowed gets `NO_ALLOWED_TOKEN`: what the request asked for cannot be met, and the engine ends it (its own error).
Greedy rows share one batched argmax; sampling rows are cut and drawn together on the logits' device (one uniform
number per row from the row's own `random.Random`, so a seeded request gets the same draws whatever else shares the
batch).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from ..executor_interface import GenerationRequest
from .guided import mask_guided_logits
from .transfers import to_device

# The token of a row that allows none (every token banned, biased to -inf or outside its guide).
NO_ALLOWED_TOKEN = -1
# Top-p alone first looks among this many best tokens (exact: it sorts everything when they hold too little).
TOP_P_CANDIDATES = 256


@dataclass(slots=True)
class SamplingParams:
    greedy: bool
    temperature: float = 1.0
    top_k: int = 0  # 0: no cut
    top_p: float = 1.0  # 1.0: no cut
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    banned_tokens: list[int] = field(default_factory=list)  # one-token bad words
    bad_sequences: list[list[int]] = field(default_factory=list)  # multi-token bad words
    embedding_bias: torch.Tensor | None = None
    log_probs: bool = False
    top_log_probs: int = 0  # the likeliest tokens returned with their log probs at each step (0: none)

    @classmethod
    def from_request(cls, request: GenerationRequest, vocab_size: int) -> SamplingParams:
        top_k = request.top_k or 0
        top_p_set = request.top_p is not None and request.top_p > 0.0
        top_p = request.top_p if top_p_set and request.top_p < 1.0 else 1.0
        temperature = request.temperature or 0.0
        # Greedy: top_k 1, or no temperature, top_k nor top_p (the interface's rule). top_k or top_p without a
        # temperature samples at temperature 1, top_p 1.0 included (as TensorRT-LLM: it is set, with no cut).
        greedy = top_k == 1 or (temperature == 0.0 and top_k == 0 and not top_p_set)
        bias = None
        if request.embedding_bias is not None:
            bias = torch.tensor(request.embedding_bias, dtype=torch.float32)
        words = [list(word) for word in request.bad_words if word]
        return cls(
            greedy=greedy,
            temperature=temperature if temperature > 0.0 else 1.0,
            top_k=top_k if 0 < top_k < vocab_size else 0,
            top_p=top_p,
            repetition_penalty=request.repetition_penalty or 1.0,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            min_tokens=request.min_tokens or 0,
            banned_tokens=sorted({word[0] for word in words if len(word) == 1}),
            bad_sequences=[word for word in words if len(word) > 1],
            embedding_bias=bias,
            log_probs=request.return_log_probs or request.num_top_log_probs > 0,
            top_log_probs=request.num_top_log_probs,
        )

    @property
    def processed_on_host(self) -> bool:
        """Bias, penalties or bad words: applied row by row from the host's view of the tokens so far."""
        return (
            self.embedding_bias is not None
            or self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or bool(self.banned_tokens)
            or bool(self.bad_sequences)
        )

    @property
    def changes_logits(self) -> bool:
        return self.processed_on_host or self.min_tokens > 0


@dataclass(slots=True)
class SamplingState:
    """What the processors need to know about one sequence at this step."""

    params: SamplingParams
    generator: random.Random | None
    token_ids: list[int]  # prompt + output so far
    output_counts: dict[int, int]  # output token -> occurrences
    num_output: int
    end_id: int | None
    guide: Any = None  # the sequence's xgrammar GrammarMatcher (guided.py), if it is guided


def banned_next_tokens(state: SamplingState) -> list[int]:
    """Tokens this sequence may not produce now: bad words whose prefix it just wrote; the end id before min_tokens."""
    banned = list(state.params.banned_tokens)
    tokens = state.token_ids
    for word in state.params.bad_sequences:
        prefix = word[:-1]
        if len(tokens) >= len(prefix) and tokens[len(tokens) - len(prefix) :] == prefix:
            banned.append(word[-1])
    # A guided sequence may end where its grammar lets it (the mask allows nothing else then), min_tokens or not.
    if state.end_id is not None and state.num_output < state.params.min_tokens and state.guide is None:
        banned.append(state.end_id)
    return banned


def ban_tokens(logits: torch.Tensor, banned: list[tuple[int, int]]) -> None:
    """In place, without waiting for the device: -inf at each (row, token id) of `banned`."""
    if banned:
        rows, ids = zip(*banned)
        index = to_device([list(rows), list(ids)], logits.device, torch.long)
        # Values made on the device: a Python scalar here is copied from the host and waits (measured on an H200).
        values = torch.full((len(banned),), float("-inf"), dtype=logits.dtype, device=logits.device)
        logits.index_put_((index[0], index[1]), values)


def _apply_penalties(row: torch.Tensor, state: SamplingState) -> None:
    """In place on one row of logits (bans are applied for all rows at once by the caller)."""
    params = state.params
    if params.embedding_bias is not None:
        row += params.embedding_bias.to(row.device)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(state.token_ids)), dtype=torch.long, device=row.device)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and state.output_counts:
        ids = torch.tensor(list(state.output_counts), dtype=torch.long, device=row.device)
        counts = torch.tensor(list(state.output_counts.values()), dtype=row.dtype, device=row.device)
        row[ids] -= params.presence_penalty + params.frequency_penalty * counts


def _candidates(scaled: torch.Tensor, params: list[SamplingParams], log_total: torch.Tensor, count: int):
    """(ids, probs, short): each row's best `count` tokens, best first, with the probability each keeps after
    top-k and top-p (not normalised); `short` marks top-p-only rows whose candidates hold less than their top_p
    (they need every token: the caller asks again for those rows)."""
    if count >= scaled.shape[-1]:
        values, ids = torch.sort(scaled, dim=-1, descending=True)
    else:
        values, ids = torch.topk(scaled, count, dim=-1)
    device = scaled.device
    top_p = to_device([p.top_p for p in params], device)
    cut_by_k = to_device([bool(p.top_k) for p in params], device)
    in_top_k = torch.arange(values.shape[-1], device=device)[None, :] < to_device(
        [p.top_k or values.shape[-1] for p in params], device)[:, None]
    # Within top-k, top-p applies to the renormalised distribution (as in Hugging Face); alone, to the full one.
    kept_values = values.masked_fill(~in_top_k, float("-inf"))
    norm = torch.where(cut_by_k, torch.logsumexp(kept_values, -1), log_total)
    probs = (kept_values - norm[:, None]).exp()
    cut_by_p = top_p < 1.0
    short = cut_by_p & ~cut_by_k & (probs.sum(-1) < top_p)
    before = probs.cumsum(-1) - probs  # probability of the better tokens
    keep = (before < top_p[:, None]) | ~cut_by_p[:, None]
    keep[:, 0] = True
    return ids, probs * keep, short


def _draw(ids: torch.Tensor | None, probs: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """The token of each row where its draw in [0, 1) falls in its cumulative `probs` (token i of `ids`, or token i
    itself without `ids`); never a token of probability 0 (rounding at the top end falls back to the last token that
    can be drawn)."""
    cumulative = probs.double().cumsum(-1)
    choice = torch.searchsorted(cumulative, (draws * cumulative[:, -1])[:, None], right=True)[:, 0]
    choice = torch.minimum(choice, (probs > 0).cumsum(-1).argmax(-1))
    return choice if ids is None else ids.gather(1, choice[:, None])[:, 0]


def _sample_rows(logits: torch.Tensor, states: list[SamplingState]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row, cut and drawn on the logits' device for the whole batch at once; with its log prob after
    temperature. Each row's one uniform draw comes from its own generator, so a seeded request draws the same
    whatever shares the batch."""
    params = [state.params for state in states]
    device = logits.device
    temperature = to_device([p.temperature for p in params], device, logits.dtype)
    scaled = logits / temperature[:, None]
    log_total = _logsumexp_by_row(scaled)
    draws = to_device([state.generator.random() for state in states], device, torch.float64)
    tokens = torch.empty(len(states), dtype=torch.long, device=device)
    uncut = [row for row, p in enumerate(params) if not p.top_k and p.top_p >= 1.0]
    cut = [row for row, p in enumerate(params) if p.top_k or p.top_p < 1.0]
    if uncut:  # the whole vocabulary, in its own order
        rows = _rows(uncut, len(states), device)
        tokens[rows] = _draw(None, (scaled[rows] - log_total[rows, None]).exp(), draws[rows])
    if cut:
        rows = _rows(cut, len(states), device)
        picked = [params[row] for row in cut]
        count = min(scaled.shape[-1], max(max(p.top_k for p in picked), TOP_P_CANDIDATES))
        ids, probs, short = _candidates(scaled[rows], picked, log_total[rows], count)
        tokens[rows] = _draw(ids, probs, draws[rows])
        if bool(short.any()):  # top-p rows that need more than the candidates: every token, sorted
            again = short.nonzero()[:, 0].tolist()
            rows = to_device(cut, device)[again]
            ids, probs, _ = _candidates(scaled[rows], [picked[i] for i in again], log_total[rows], scaled.shape[-1])
            tokens[rows] = _draw(ids, probs, draws[rows])
    finite = torch.isfinite(log_total)  # no token allowed (replaced by the caller) or non-finite logits: a valid index
    tokens = torch.where(finite, tokens, logits.argmax(-1))
    log_probs = torch.where(finite, scaled.gather(1, tokens[:, None])[:, 0] - log_total, float("-inf"))
    return tokens, log_probs


def _logsumexp_by_row(scaled: torch.Tensor) -> torch.Tensor:
    """`torch.logsumexp` over each row, each row summed in one order whatever the row count: torch's CPU reduction
    splits a lone row's sum over its intra-op threads (the low bits of a sampled row's log prob then changed with
    the rows sampled beside it and the thread count), so a lone row goes with a copy of itself."""
    if scaled.shape[0] == 1 and scaled.device.type == "cpu":
        return torch.logsumexp(scaled.expand(2, -1).contiguous(), -1)[:1]
    return torch.logsumexp(scaled, -1)


def _rows(rows: list[int], count: int, device: torch.device) -> torch.Tensor | slice:
    """An index of `rows` out of `count`; all of them: a slice, which indexes without copying."""
    return slice(None) if len(rows) == count else to_device(rows, device)


TopLogProbs = list[tuple[int, float]]  # (token id, log prob), likeliest first


def sample_next_tokens(
    logits: torch.Tensor, states: list[SamplingState]
) -> tuple[list[int], list[float | None], list[TopLogProbs | None]]:
    """One token per row of `[rows, vocab]` float32 logits, plus its log prob and the likeliest tokens' where the
    request asked for them."""
    guides = [state.guide for state in states]
    guided = any(guide is not None for guide in guides)
    if guided:
        logits = logits.clone()  # the caller's logits stay raw (NVIDIA's generation logits)
        mask_guided_logits(logits, guides)
    changed = any(state.params.changes_logits for state in states)
    if changed:
        if not guided:
            logits = logits.clone()
        banned_rows: list[int] = []
        banned_ids: list[int] = []
        for row, state in enumerate(states):
            if state.params.changes_logits:
                _apply_penalties(logits[row], state)
                banned = banned_next_tokens(state)
                banned_rows += [row] * len(banned)
                banned_ids += banned
        if banned_ids:  # one indexed write for the whole batch: per-row writes cost one kernel launch each on CUDA
            index = to_device([banned_rows, banned_ids], logits.device, torch.long)
            logits[index[0], index[1]] = float("-inf")
    tokens_on_device, log_probs_on_device = sample_on_device(logits, states)
    tokens = tokens_on_device.tolist()
    log_probs: list[float | None] = [None] * len(states)
    if any(state.params.log_probs for state in states):
        values = log_probs_on_device.tolist()
        log_probs = [value if state.params.log_probs else None for value, state in zip(values, states)]
    tops: list[TopLogProbs | None] = [None] * len(states)
    for row, state in enumerate(states):
        if state.params.top_log_probs:
            tops[row], log_probs[row] = _top_log_probs(logits[row], state.params, tokens[row])
    if guided or changed:
        for row in (logits.amax(-1) == float("-inf")).nonzero()[:, 0].tolist():
            tokens[row], log_probs[row], tops[row] = NO_ALLOWED_TOKEN, None, None
    return tokens, log_probs, tops


def _top_log_probs(row: torch.Tensor, params: SamplingParams, token: int) -> tuple[TopLogProbs, float]:
    """(the row's likeliest tokens with their log probs, the chosen token's log prob), both from one log-softmax of
    the distribution the token was drawn from (after temperature; greedy: the logits as they are). Tokens of log
    prob -inf (banned, outside a guide) are never among them. Rows asking for these are sampled on the host, one
    row at a time: a request asks for them, not every step of the batch."""
    scaled = row if params.greedy else row / params.temperature
    log_softmax = torch.log_softmax(scaled.float(), -1)
    values, ids = torch.topk(log_softmax, min(params.top_log_probs, log_softmax.shape[-1]))
    top = [(i, v) for i, v in zip(ids.tolist(), values.tolist()) if v != float("-inf")]
    return top, float(log_softmax[token]) if 0 <= token < log_softmax.shape[-1] else float("-inf")


def sample_on_device(logits: torch.Tensor, states: list[SamplingState]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, log probs) of `[rows, vocab]` float32 logits as tensors on the logits' device, without waiting for
    the device (except with top-k or top-p rows: whether their first candidates hold enough is read on the host):
    what the engine's overlapped step feeds to the next step before the host reads it. Guides, penalties and bans
    are the caller's (they need the host's view of the tokens so far). A row's log prob is meaningful only where its
    request asked for one."""
    device = logits.device
    sampling_rows = [row for row, state in enumerate(states) if not state.params.greedy]
    # The greedy rows' answer (sampling rows are overwritten below); skipped when no row is greedy.
    if len(sampling_rows) < len(states):
        tokens = logits.argmax(-1)
    else:
        tokens = torch.zeros(len(states), dtype=torch.long, device=device)
    log_probs = torch.zeros(len(states), dtype=logits.dtype, device=device)
    greedy_rows = [row for row, state in enumerate(states) if state.params.greedy and state.params.log_probs]
    if greedy_rows:
        index = _rows(greedy_rows, len(states), device)
        log_probs[index] = torch.log_softmax(logits[index], -1).gather(1, tokens[index][:, None])[:, 0]
    if sampling_rows:
        rows = _rows(sampling_rows, len(states), device)
        tokens[rows], log_probs[rows] = _sample_rows(logits[rows], [states[row] for row in sampling_rows])
    return tokens, log_probs
