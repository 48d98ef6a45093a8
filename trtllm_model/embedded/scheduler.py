"""Who runs in the next step: the running batch decodes, and queued requests join while the limits allow.

Limits per step: at most `max_batch_size` sequences, at most `max_num_tokens` tokens through the model (one per
decoding sequence plus every prompt token prefilled: a prompt's cached prefix costs nothing), and the KV blocks a
request can ever fill (prompt + max_tokens, less the blocks it shares) free in the pool (`block_manager`).
Admission is first come, first served: a request that does not fit yet holds back the ones behind it, so a long
prompt cannot be starved by short ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .sequence import Sequence, Status

# A prefill group is split when padding would add more than this share of its real tokens.
MAX_PADDING_SHARE = 0.25


@dataclass(slots=True)
class SchedulerLimits:
    max_batch_size: int
    max_num_tokens: int


class Scheduler:
    def __init__(self, limits: SchedulerLimits, blocks: BlockManager) -> None:
        self.limits = limits
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    def admit(self, running: list[Sequence]) -> list[Sequence]:
        """Take the queued sequences that join the batch this step, their blocks allocated."""
        admitted: list[Sequence] = []
        tokens_left = self.limits.max_num_tokens - len(running)
        while self.waiting and len(running) + len(admitted) < self.limits.max_batch_size:
            head = self.waiting[0]
            table = self.blocks.allocate(
                head.token_ids, head.prompt_len, head.prompt_len + head.max_tokens, max_prefill_tokens=tokens_left,
                salt=head.cache_salt,
            )
            if table is None:
                break
            head.blocks, head.num_computed = table, table.cached_tokens
            tokens_left -= head.prefill_len
            head.status = Status.RUNNING
            admitted.append(self.waiting.popleft())
        return admitted

    def remove_finished(self) -> list[Sequence]:
        """Queued sequences that ended before running (cancelled, timed out)."""
        gone = [sequence for sequence in self.waiting if sequence.is_finished]
        if gone:
            self.waiting = deque(sequence for sequence in self.waiting if not sequence.is_finished)
        return gone


def prefill_groups(sequences: list[Sequence]) -> list[list[Sequence]]:
    """Split admitted prompts into left-padded forwards that waste little compute on padding."""
    groups: list[list[Sequence]] = []
    for sequence in sorted(sequences, key=lambda s: s.prefill_len, reverse=True):
        if groups:
            group = groups[-1]
            longest = group[0].prefill_len  # sorted, so the first is the longest
            real = sum(s.prefill_len for s in group) + sequence.prefill_len
            if longest * (len(group) + 1) <= (1.0 + MAX_PADDING_SHARE) * real:
                group.append(sequence)
                continue
        groups.append([sequence])
    return groups
