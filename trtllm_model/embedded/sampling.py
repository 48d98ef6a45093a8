"""From one step's logits to one token per sequence, each with its own sampling settings and random generator.

Order, per row: embedding bias, repetition penalty (over prompt and output, as in Hugging Face), presence and
frequency penalties (over the output only, as in OpenAI's API), bans (bad words; the end id before min_tokens),
temperature; then top-k and top-p cut the distribution that is sampled. A log prob is that of the chosen token
under the distribution after temperature and before top-k/top-p.
Greedy rows share one batched argmax; each sampling row draws from its own `torch.Generator`, so a seeded request
gets the same random draws whatever else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..executors.base import GenerationRequest


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

    @classmethod
    def from_request(cls, request: GenerationRequest, vocab_size: int) -> SamplingParams:
        top_k = request.top_k or 0
        top_p = request.top_p if request.top_p is not None and 0.0 < request.top_p < 1.0 else 1.0
        temperature = request.temperature or 0.0
        # Greedy: top_k 1, or no temperature and no cut (the interface's rule). A cut without a temperature samples
        # at temperature 1.
        greedy = top_k == 1 or (temperature == 0.0 and top_k == 0 and top_p == 1.0)
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
            log_probs=request.return_log_probs,
        )

    @property
    def changes_logits(self) -> bool:
        return (
            self.embedding_bias is not None
            or self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or bool(self.banned_tokens)
            or bool(self.bad_sequences)
            or self.min_tokens > 0
        )


@dataclass(slots=True)
class SamplingState:
    """What the processors need to know about one sequence at this step."""

    params: SamplingParams
    generator: torch.Generator | None
    token_ids: list[int]  # prompt + output so far
    output_counts: dict[int, int]  # output token -> occurrences
    num_output: int
    end_id: int | None


def banned_next_tokens(state: SamplingState) -> list[int]:
    """Tokens this sequence may not produce now: bad words whose prefix it just wrote; the end id before min_tokens."""
    banned = list(state.params.banned_tokens)
    tokens = state.token_ids
    for word in state.params.bad_sequences:
        prefix = word[:-1]
        if len(tokens) >= len(prefix) and tokens[len(tokens) - len(prefix) :] == prefix:
            banned.append(word[-1])
    if state.end_id is not None and state.num_output < state.params.min_tokens:
        banned.append(state.end_id)
    return banned


def _apply_penalties_and_bans(row: torch.Tensor, state: SamplingState) -> None:
    """In place on one row of logits."""
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
    banned = banned_next_tokens(state)
    if banned:
        row[torch.tensor(banned, dtype=torch.long, device=row.device)] = float("-inf")


def _cut_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits outside the top k / the smallest set with probability >= top_p become -inf (the best one stays)."""
    if top_k:
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        row = row.masked_fill(drop, float("-inf"))
    return row


def sample_next_tokens(logits: torch.Tensor, states: list[SamplingState]) -> tuple[list[int], list[float | None]]:
    """One token per row of `[rows, vocab]` float32 logits, plus its log prob where the request asked for it."""
    if any(state.params.changes_logits for state in states):
        logits = logits.clone()
        for row, state in enumerate(states):
            if state.params.changes_logits:
                _apply_penalties_and_bans(logits[row], state)
    tokens = logits.argmax(-1).tolist()  # the greedy rows' answer; sampling rows are overwritten below
    log_probs: list[float | None] = [None] * len(states)
    for row, state in enumerate(states):
        params = state.params
        if params.greedy:
            if params.log_probs:
                log_probs[row] = float(torch.log_softmax(logits[row], -1)[tokens[row]])
            continue
        scaled = logits[row] / params.temperature
        cut = _cut_top_k_top_p(scaled, params.top_k, params.top_p)
        token = int(torch.multinomial(cut.softmax(-1), 1, generator=state.generator))
        tokens[row] = token
        if params.log_probs:
            log_probs[row] = float(torch.log_softmax(scaled, -1)[token])
    return tokens, log_probs
