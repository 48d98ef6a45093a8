"""How many rows of batched requests the executor holds at once: a bounded share of its batch slots.

A Triton request may carry many rows (NVIDIA's batch of prompts, up to `max_batch_size`), and `ensemble` never
passes its client's cancellation on (Triton's ensemble scheduler gives it only to steps it starts later). Without a
bound, one such request takes every batch slot and a client that opens and cancels them in a loop holds everybody
else's requests behind rows nobody reads. So rows of batched requests share at most `limit` executor slots between
them; the others wait here, are handed out one per request in turn (two batched clients progress together), and end
at once when their request is cancelled, never reaching the executor. Single-row requests never wait here: the other
slots stay theirs.

Pure bookkeeping under the poller's lock; the poller enqueues what `take_ready` hands out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .request_context import RequestContext

# The share of the executor's batch slots that rows of batched requests may hold when the model sets no limit.
DEFAULT_SLOT_SHARE = 0.5


def default_limit(batch_slots: int | None) -> int | None:
    """`max_batched_rows_in_flight` when config.pbtxt leaves it unset: half the engine's slots (None: unbounded,
    for an executor that does not say how many rows it runs at once)."""
    if not batch_slots:
        return None
    return max(1, int(batch_slots * DEFAULT_SLOT_SHARE))


@dataclass(eq=False)
class RowGroup:
    """The rows of one batched Triton request that have not reached the executor yet."""

    held: deque[RequestContext] = field(default_factory=deque)
    running: int = 0  # rows handed to the executor and not ended


class BatchedRowGate:
    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_flight = 0  # rows of batched requests handed to the executor and not ended
        self.held = 0  # rows waiting here, over every group
        self._turns: deque[RowGroup] = deque()  # groups with held rows, in the order they get their next row

    def add(self, rows: list[RequestContext]) -> None:
        """A batched request's rows: they wait for `take_ready`."""
        group = RowGroup(deque(rows))
        for ctx in rows:
            ctx.row_group = group
        self.held += len(rows)
        self._turns.append(group)

    def take_ready(self) -> list[RequestContext]:
        """The rows that may go to the executor now, one per request in turn, each counted in flight."""
        ready = []
        while self._turns and (self.limit is None or self.in_flight < self.limit):
            group = self._turns.popleft()
            ctx = group.held.popleft()
            if group.held:
                self._turns.append(group)
            ctx.holds_row_slot = True
            group.running += 1
            self.in_flight += 1
            self.held -= 1
            ready.append(ctx)
        return ready

    def ended(self, ctx: RequestContext) -> None:
        """A row handed out by `take_ready` ended (its final step, a refusal, a failure): its slot is free."""
        if ctx.holds_row_slot:
            ctx.holds_row_slot = False
            ctx.row_group.running -= 1
            self.in_flight -= 1

    def take_held(self, group: RowGroup) -> list[RequestContext]:
        """The rows of `group` still waiting here, removed (their request was cancelled or stopped)."""
        rows = list(group.held)
        group.held.clear()
        self.held -= len(rows)
        if rows:
            self._turns.remove(group)
        return rows

    def take_all_held(self) -> list[RequestContext]:
        """Every waiting row, removed (the model fails or shuts down)."""
        rows = [ctx for group in self._turns for ctx in group.held]
        for group in self._turns:
            group.held.clear()
        self._turns.clear()
        self.held = 0
        return rows

    def waiting_groups(self) -> list[RequestContext]:
        """One row of each request that has no row in the executor (the watch asks about those), for the
        cancellation watch: a request whose client left ends without waiting for a slot."""
        return [group.held[0] for group in self._turns if not group.running]
