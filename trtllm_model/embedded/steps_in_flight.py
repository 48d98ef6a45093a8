"""Steps launched without waiting for them (the engine's overlapped steps): the sampled tokens stay on the device to
feed the next step, and their copies to the host are read an iteration later (`Engine._accept_in_flight`).

`StepLauncher` launches them: one step's sampling (`sampling`), or several greedy decode steps at once
(`greedy_steps`); each returns the `StepInFlight`s the engine reads later. Which steps may overlap, and accepting
their tokens, stay with the engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .runner import ModelRunner
from .sampling import ban_tokens, sample_on_device
from .sequence import Sequence

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StepInFlight:
    """A launched step whose sampled tokens the host has not read yet: its rows (the decoding sequences, then the
    prompts it completed), the tokens on the device (what the next step feeds them), and their copies on their way to
    the host, complete once `ready` is."""

    rows: list[Sequence]
    decoding: int  # rows[:decoding] decoded; the rest sampled their first token after a prefill
    tokens: torch.Tensor
    host_tokens: torch.Tensor
    host_log_probs: torch.Tensor | None  # None when no row returns log probs (none were copied)
    ready: torch.cuda.Event | None  # None on CPU, where the copies are done when made


@dataclass(slots=True)
class GreedySteps:
    """Greedy decode steps an iteration launches at once: how many, and each row's end id and the steps it is
    banned in (min_tokens; 0: none)."""

    steps: int
    end_ids: list[int]
    bans: list[int]


class StepLauncher:
    """Launches steps on `runner`'s device and starts their tokens' copies to the host, without waiting for either.
    `launches` counts them (the engine compares it to tell whether an iteration launched anything)."""

    def __init__(self, runner: ModelRunner, max_rows: int) -> None:
        self.runner = runner
        self.max_rows = max_rows
        self.launches = 0
        self._host_buffers: dict[tuple[str, int], torch.Tensor] = {}  # (what, turn) -> copies from the device

    def greedy_steps(self, decoding: list[Sequence], fed: torch.Tensor | None,
                     greedy: GreedySteps) -> list[StepInFlight]:
        """`greedy.steps` decode steps of the rows in one launch (`ModelRunner.decode_greedy`: each step fed the last
        one's argmax on the device; the first fed `fed`, the last in-flight step's tokens), their tokens' copy to the
        host started: one StepInFlight a step, oldest first."""
        steps = greedy.steps
        tokens = self.runner.decode_greedy(decoding, fed, steps, greedy.end_ids, greedy.bans)
        host = self._host_copy("greedy tokens", tokens)
        ready = _recorded_event(tokens)
        for row, sequence in enumerate(decoding):
            sequence.pending += steps
            sequence.device_row = row
        self.launches += 1
        return [StepInFlight(decoding, len(decoding), tokens[step], host[step], None, ready) for step in range(steps)]

    def sampling(self, rows: list[Sequence], decoding: int, logits: torch.Tensor) -> StepInFlight | None:
        """Sample the rows on the device and start the tokens' copy to the host, without waiting for either; None
        when a row's sampling needs the host (guides, penalties, logits to return) or the launch failed: the step
        is then sampled as a plain one."""
        # One pass over the rows (every step makes it): the end ids of rows short of min_tokens, banned first (the only
        # ban a row sampled here can need), and whether every row is a plain argmax.
        banned, plain = [], True
        for row, sequence in enumerate(rows):
            if not sequence.overlappable:
                return None
            if sequence.end_id_banned_steps():
                banned.append((row, sequence.end_id))
            plain = plain and sequence.sampling.greedy and not sequence.sampling.log_probs
        try:
            ban_tokens(logits, banned)
            if plain:
                # The usual step: an argmax, without per-row states (building them took about a tenth of the engine
                # thread's time, host-only, 256 streams).
                tokens, host_log_probs = logits.argmax(-1), None  # no row returns log probs
            else:
                tokens, log_probs = sample_on_device(logits, [sequence.sampling_state() for sequence in rows])
                host_log_probs = self._host_copy("log probs", log_probs)
            host_tokens = self._host_copy("tokens", tokens)
            ready = _recorded_event(tokens)
        except Exception as exc:  # noqa: BLE001 - sampled again as a plain step, where a row's failure stays its own
            log.warning("sampling %d rows on the device failed (%s); the step is sampled on the host", len(rows), exc)
            return None
        for row, sequence in enumerate(rows):
            sequence.pending += 1
            sequence.device_row = row
        self.launches += 1
        return StepInFlight(rows, decoding, tokens, host_tokens, host_log_probs, ready)

    def _host_copy(self, what: str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s copy to the host, started without waiting for the device, into this launch's buffer for `what`:
        two per kind, used in turn (the last launch's may still be unread), pinned on CUDA so that the copy does not
        wait for the device. Allocated once, for `max_rows` rows."""
        key = (what, self.launches % 2)
        buffer = self._host_buffers.get(key)
        shape = tensor.shape
        if buffer is None or buffer.dtype != tensor.dtype or any(h < n for h, n in zip(buffer.shape, shape)):
            size = (*shape[:-1], max(shape[-1], self.max_rows))
            buffer = torch.empty(size, dtype=tensor.dtype, pin_memory=self.runner.device.type == "cuda")
            self._host_buffers[key] = buffer
        host = buffer[tuple(slice(n) for n in shape)]
        host.copy_(tensor, non_blocking=True)
        return host


def _recorded_event(tensor: torch.Tensor) -> torch.cuda.Event | None:
    """On CUDA, an event recorded after the work queued so far (what reading `tensor`'s host copy waits for); None on
    the CPU, where the copies are done when made."""
    if tensor.device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event
