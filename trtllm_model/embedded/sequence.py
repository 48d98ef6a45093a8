"""One request's state inside the engine, from queued to finished."""

from __future__ import annotations

import enum
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..executor_interface import FinishReason, GenerationRequest, Step
from .block_manager import BlockTable
from .guided import advance
from .sampling import SamplingParams, SamplingState


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# What the per-row loops of every step compare a status with: a module name, not an enum lookup per row.
FINISHED = Status.FINISHED


# eq=False: a sequence is itself, not its fields (list.remove and `in` compared every field, token lists included).
@dataclass(slots=True, eq=False)
class Sequence:
    request_id: int
    prompt_len: int
    max_tokens: int
    end_id: int | None
    stop_words: list[list[int]]
    sampling: SamplingParams
    generator: random.Random | None
    deadline: float | None  # time.monotonic() past which it ends TIMED_OUT
    token_ids: list[int]  # prompt, then output
    status: Status = Status.WAITING
    finish_reason: FinishReason = FinishReason.NOT_FINISHED
    output_counts: dict[int, int] = field(default_factory=dict)
    cum_log_prob: float = 0.0
    # NVIDIA's return_context_logits / return_generation_logits: raw model logits, before any sampling step.
    want_context_logits: bool = False
    want_generation_logits: bool = False
    want_perf_metrics: bool = False
    # With want_context_logits: the logits of the prompt's chunks computed so far (the engine's prefill, chunk by chunk).
    context_chunks: list[np.ndarray] = field(default_factory=list)
    blocks: BlockTable | None = None  # its KV blocks, from admission until it ends or is preempted
    num_computed: int = 0  # leading tokens whose keys and values are in the pool (the cached prefix, then more)
    prefill_end: int = 0  # while prefilling: num_computed once this step's chunk is computed
    guide: Any = None  # xgrammar GrammarMatcher of a guided request (set by the executor at enqueue)
    cache_salt: str | None = None  # shares cached blocks only with sequences of the same salt
    # Overlapped steps (engine.py): tokens sampled on the device that the host has not read yet (up to two
    # iterations' decode steps), and the row of the newest one in the last launched step's sampled tokens (what the
    # next step feeds this sequence).
    pending: int = 0
    device_row: int = 0
    # `may_overlap()`, set by the engine when it takes the sequence (the guide is known by then); a field, not a
    # property: every overlapped step reads it for every row, twice.
    overlappable: bool = False

    @classmethod
    def from_request(
        cls, request_id: int, request: GenerationRequest, vocab_size: int, default_end_id: int | None
    ) -> Sequence:
        sampling = SamplingParams.from_request(request, vocab_size)
        generator = None
        if not sampling.greedy:  # seeded: the same draws every time; else from the system's entropy
            generator = random.Random(request.seed)
        end_id = request.end_id if request.end_id is not None else default_end_id
        deadline = None
        if request.allotted_time_ms is not None and request.allotted_time_ms > 0:
            deadline = time.monotonic() + request.allotted_time_ms / 1000.0
        return cls(
            request_id=request_id,
            prompt_len=len(request.input_ids),
            max_tokens=request.max_tokens,
            end_id=end_id if end_id is not None and end_id >= 0 else None,  # a negative end id means none
            stop_words=[list(word) for word in request.stop_words if word],
            sampling=sampling,
            generator=generator,
            want_context_logits=request.return_context_logits,
            want_generation_logits=request.return_generation_logits,
            want_perf_metrics=request.return_perf_metrics,
            deadline=deadline,
            token_ids=list(request.input_ids),
            cache_salt=request.cache_salt,
        )

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def prefill_len(self) -> int:
        """Tokens this step's prefill chunk computes (a resumed sequence's generated tokens count as prompt)."""
        return self.prefill_end - self.num_computed

    @property
    def num_tokens(self) -> int:
        """Its tokens, those sampled on the device but not read by the host yet included."""
        return len(self.token_ids) + self.pending

    @property
    def wants_prompt_logits(self) -> bool:
        """Its prefill computes logits at every prompt token (NVIDIA's context logits): its prompt's first prefill, not
        a preempted sequence's resumption."""
        return self.want_context_logits and not self.num_output

    def may_overlap(self) -> bool:
        """Whether its next token may be sampled before the host has read its last one: nothing in its sampling reads
        the tokens so far (no guide, bias, penalty or bad word; min_tokens needs only their count) and no logits go
        back to the client, nor its top log probs (sampled on the host)."""
        return (self.guide is None and not self.sampling.processed_on_host and not self.want_generation_logits
                and not self.want_context_logits and not self.sampling.top_log_probs)

    def end_id_banned_steps(self) -> int:
        """How many of its next tokens may not be its end id (0: none): an unguided sequence short of min_tokens,
        counting the tokens sampled on the device that the host has not read yet (a guide decides where a guided one
        may end)."""
        if not self.sampling.min_tokens or self.end_id is None or self.guide is not None:
            return 0
        return max(0, self.sampling.min_tokens - (len(self.token_ids) + self.pending - self.prompt_len))

    def ends_once_read(self, max_positions: int) -> bool:
        """Whether the tokens on the device already end it by length (so the next step need not feed it)."""
        if not self.pending:
            return False
        tokens = len(self.token_ids) + self.pending  # every step asks this of every row: no properties here
        return tokens - self.prompt_len >= self.max_tokens or tokens >= max_positions

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def sampling_state(self) -> SamplingState:
        return SamplingState(
            params=self.sampling,
            generator=self.generator,
            token_ids=self.token_ids,
            output_counts=self.output_counts,
            num_output=self.num_output + self.pending,  # what it will have once the host reads them
            end_id=self.end_id,
            guide=self.guide,
        )

    def finish(self, reason: FinishReason) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason

    def ends_with_stop_word(self) -> bool:
        output_len = self.num_output
        for word in self.stop_words:
            if len(word) <= output_len and self.token_ids[len(self.token_ids) - len(word) :] == word:
                return True
        return False

    def accept(self, token: int, log_prob: float | None, max_positions: int) -> Step:
        """Take the sampled token; returns the step for the client (final if the sequence ended here)."""
        if token == self.end_id and (self.num_output >= self.sampling.min_tokens or self.guide is not None):
            # The end token itself is not part of the output (as in TensorRT-LLM).
            self.finish(FinishReason.END_ID)
            return self.step([], None)
        self.token_ids.append(token)
        self.output_counts[token] = self.output_counts.get(token, 0) + 1
        if log_prob is not None:
            self.cum_log_prob += log_prob
        num_output = len(self.token_ids) - self.prompt_len
        if self.guide is not None and advance(self.guide, token):
            self.finish(FinishReason.END_ID)  # the grammar accepts nothing more
        elif self.stop_words and num_output >= self.sampling.min_tokens and self.ends_with_stop_word():
            self.finish(FinishReason.STOP_WORDS)
        elif num_output >= self.max_tokens or len(self.token_ids) >= max_positions:
            self.finish(FinishReason.LENGTH)
        return self.step([token], log_prob)

    def step(self, tokens: list[int], log_prob: float | None = None) -> Step:
        # Every row of every step comes here: positional fields, no properties.
        if self.sampling.log_probs:
            step = Step(self.request_id, tokens, self.status is FINISHED, self.finish_reason,
                        [log_prob] if tokens else [], self.cum_log_prob)
        else:
            step = Step(self.request_id, tokens, self.status is FINISHED, self.finish_reason)
        if self.want_perf_metrics and self.blocks is not None:
            # As TensorRT-LLM counts them: blocks found cached, blocks allocated for it; its "total" allocated blocks
            # are the allocated ones (NVIDIA's CI checks total == new per request), reused ones not among them.
            step.kv_cache_reused_blocks = self.blocks.reused_blocks
            step.kv_cache_alloc_new_blocks = self.blocks.new_blocks
            step.kv_cache_alloc_total_blocks = self.blocks.new_blocks
        return step
