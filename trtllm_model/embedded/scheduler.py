"""Who runs in the next step: the running batch decodes, prompts are prefilled in chunks, queued requests join.

Limits per step: at most `max_batch_size` sequences, at most `max_num_tokens` tokens through the model (one per
decoding sequence plus every prompt token prefilled: a prompt's cached prefix costs nothing). A prompt longer than
the tokens left in a step is prefilled in chunks over several steps (chunked prefill), beside the decoding batch,
so a long prompt neither stalls the running streams nor waits for the engine to empty.

KV blocks go by what a sequence needs now, not by what it may generate (`block_manager`): a request is admitted
when the pool holds its prompt's blocks, and a decoding sequence takes one more block at each block boundary.
When the pool runs out, the newest sequence is preempted (as vLLM does): its blocks are freed and it goes back to
the front of the queue; admitted again, it prefills its prompt and the tokens it generated (its sent tokens are
not sent again: it resumes where it stopped). Admission is first come, first served: a request that does not fit
yet holds back the ones behind it, so a long prompt cannot be starved by short ones. Nor does a prompt being prefilled
hold back the queue: while prompts are partly prefilled, queued requests join with half of a step's prompt tokens and
the partial prefills share the rest equally, so a newcomer is prefilled between a long prompt's chunks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .padded_groups import padded_groups
from .sequence import Sequence, Status

# Blocks admission leaves free while others run, so their decoding does not at once preempt the newcomer.
SPARE_BLOCKS_SHARE = 0.01


@dataclass(slots=True)
class SchedulerLimits:
    max_batch_size: int
    max_num_tokens: int


class Scheduler:
    def __init__(self, limits: SchedulerLimits, blocks: BlockManager) -> None:
        self.limits = limits
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []  # admitted, their prompt partly computed (oldest first)
        self.preemptions = 0  # since start

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    def make_room_for_decode(self, running: list[Sequence]) -> list[Sequence]:
        """The running sequences that decode this step, each with a block for the token it feeds. When the pool is
        out of blocks the newest sequences are preempted: partial prefills first, then running ones from the end."""
        decoding: list[Sequence] = []
        pending = deque(running)
        block_size = self.blocks.block_size
        while pending:
            sequence = pending.popleft()
            # The usual step: it has room (plain arithmetic, not `num_tokens`: every step asks it of every row).
            if len(sequence.token_ids) + sequence.pending <= len(sequence.blocks.block_ids) * block_size:
                decoding.append(sequence)
                continue
            while not self.blocks.grow(sequence.blocks, sequence.num_tokens):
                victim = self.prefilling.pop() if self.prefilling else pending.pop() if pending else sequence
                self._preempt(victim)
                if victim is sequence:
                    break
            else:
                decoding.append(sequence)
        return decoding

    def _preempt(self, sequence: Sequence) -> None:
        self.blocks.free(sequence.blocks)
        sequence.blocks, sequence.num_computed, sequence.status = None, 0, Status.WAITING
        self.waiting.appendleft(sequence)
        self.preemptions += 1

    def admit(self, running: list[Sequence], prompt_tokens: int | None = None) -> list[Sequence]:
        """The sequences prefilled this step, each with `prefill_end` set (the chunk it computes): partial prefills
        first, then queued sequences that join, their blocks allocated. At most `prompt_tokens` prompt tokens (the
        step budget's share, step_budget.py), and never more than the step's token budget leaves."""
        tokens_left = self.limits.max_num_tokens - len(running)
        if prompt_tokens is not None:
            tokens_left = min(tokens_left, prompt_tokens)
        partial = list(self.prefilling)
        seats = self.limits.max_batch_size - len(running) - len(partial)
        # Queued requests join with half the step's prompt tokens while partial prefills wait (all of them when none
        # do), and the partial prefills take what is left: a long prompt's chunks do not hold every later request back
        # until its prefill ends, and it still gets at least half of each step.
        joining_tokens = tokens_left // 2 if partial else tokens_left
        spare = int(self.blocks.num_blocks * SPARE_BLOCKS_SHARE) if running or partial else 0
        joined: list[Sequence] = []
        while self.waiting and seats > 0 and joining_tokens > 0:
            head = self.waiting[0]
            # A prompt whose context logits go back is computed whole: its cached prefix would have none.
            table = self.blocks.allocate(head.token_ids, len(head.token_ids), head.cache_salt, spare,
                                         reuse=not head.wants_prompt_logits)
            if table is None:
                break
            head.blocks, head.num_computed = table, table.cached_tokens
            head.status = Status.RUNNING
            chunk = self._chunk(head, joining_tokens)
            joining_tokens -= chunk
            tokens_left -= chunk
            seats -= 1
            self.prefilling.append(self.waiting.popleft())
            joined.append(head)
        # Partial prefills share the rest equally, the shortest first so that what one does not need goes to the
        # longer ones: a newcomer whose prompt took more than its first step is not held back by a long prompt either.
        chunked: set[int] = set()
        by_remaining = sorted(partial, key=lambda sequence: len(sequence.token_ids) - sequence.num_computed)
        for index, sequence in enumerate(by_remaining):
            if tokens_left <= 0:
                break
            tokens_left -= self._chunk(sequence, -(-tokens_left // (len(by_remaining) - index)))
            chunked.add(id(sequence))
        return [sequence for sequence in partial if id(sequence) in chunked] + joined

    @staticmethod
    def _chunk(sequence: Sequence, tokens_left: int) -> int:
        """Set the sequence's chunk for this step (at most `tokens_left` tokens); returns its length."""
        chunk = min(len(sequence.token_ids) - sequence.num_computed, tokens_left)
        sequence.prefill_end = sequence.num_computed + chunk
        return chunk

    def prefilled(self, sequence: Sequence) -> None:
        """The sequence's prefill ended (it decodes from now on, or it failed)."""
        self.prefilling.remove(sequence)

    def remove_finished(self) -> list[Sequence]:
        """Queued or prefilling sequences that ended before decoding (cancelled, timed out)."""
        gone = [sequence for sequence in [*self.waiting, *self.prefilling] if sequence.is_finished]
        if gone:
            self.waiting = deque(sequence for sequence in self.waiting if not sequence.is_finished)
            self.prefilling = [sequence for sequence in self.prefilling if not sequence.is_finished]
        return gone


def prefill_groups(sequences: list[Sequence], forward_cost_tokens: float) -> list[list[Sequence]]:
    """Admitted prompts' chunks split into left-padded forwards: the split that computes fewest padded tokens, a
    forward counted as `forward_cost_tokens` more (`ModelRunner.prefill_forward_cost_tokens`). A chunk whose logits
    at every token go back (context logits) has a forward of its own."""
    alone = [[sequence] for sequence in sequences if sequence.wants_prompt_logits]
    sequences = [sequence for sequence in sequences if not sequence.wants_prompt_logits]
    if not sequences:
        return alone
    groups = padded_groups([sequence.prefill_len for sequence in sequences], forward_cost_tokens)
    return [[sequences[row] for row in group] for group in groups] + alone
