"""Who runs in the next step: the running batch decodes, and queued requests join while the limits allow.

Limits per step: at most `max_batch_size` sequences, and at most `max_num_tokens` tokens through the model
(one per decoding sequence plus every prompt token prefilled), and the KV cache the batch reserves for the whole
life of its requests within the memory budget (`kv_budget`). Admission is first come, first served: a request
that does not fit yet holds back the ones behind it, so a long prompt cannot be starved by short ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .kv_budget import KvBudget
from .sequence import Sequence, Status

# A prefill group is split when padding would add more than this share of its real tokens.
MAX_PADDING_SHARE = 0.25


@dataclass(slots=True)
class SchedulerLimits:
    max_batch_size: int
    max_num_tokens: int
    kv_budget: KvBudget


class Scheduler:
    def __init__(self, limits: SchedulerLimits) -> None:
        self.limits = limits
        self.waiting: deque[Sequence] = deque()

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    def admit(self, running: list[Sequence]) -> list[Sequence]:
        """Take the queued sequences that join the batch this step."""
        admitted: list[Sequence] = []
        tokens_left = self.limits.max_num_tokens - len(running)
        while self.waiting and len(running) + len(admitted) < self.limits.max_batch_size:
            head = self.waiting[0]
            if head.prompt_len > tokens_left or not self.limits.kv_budget.fits([*running, *admitted, head]):
                break
            tokens_left -= head.prompt_len
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
    for sequence in sorted(sequences, key=lambda s: s.prompt_len, reverse=True):
        if groups:
            group = groups[-1]
            longest = group[0].prompt_len  # sorted, so the first is the longest
            real = sum(s.prompt_len for s in group) + sequence.prompt_len
            if longest * (len(group) + 1) <= (1.0 + MAX_PADDING_SHARE) * real:
                group.append(sequence)
                continue
        groups.append([sequence])
    return groups
