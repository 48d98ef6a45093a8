"""The engine loop, on its own thread: each iteration decodes the running batch, prefills the requests that join,
samples, and publishes the new tokens as steps. Callers talk to it through `submit`, `cancel` and `wait_steps`.

Requests join and leave only between iterations (in-flight batching): a request that finishes or is cancelled
frees its row at once, and a new one is prefilled at the next iteration instead of waiting for the batch to drain.

A failure the engine can pin on one request (its prefill, retried alone when it was part of a group; its sampling,
retried row by row; its context logits) fails that request with an error step and frees its row; the batch goes
on. A failure of the whole batch's decode forward, of the cache, or `MAX_FAILURES_IN_A_ROW` failed requests with
no success between them stop the engine: every open request then ends with the engine's error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from ..executor_interface import FinishReason, IterationStats, KvCacheStats, Step
from .kv_budget import KvBudget, reserved_slots
from .runner import ModelRunner
from .sampling import sample_next_tokens
from .scheduler import Scheduler, SchedulerLimits, prefill_groups
from .sequence import Sequence

log = logging.getLogger(__name__)

# Requests failed one after another with no success between: the fault is the engine's, not theirs.
MAX_FAILURES_IN_A_ROW = 8


@dataclass(slots=True)
class EngineConfig:
    max_batch_size: int
    max_num_tokens: int
    kv_budget: KvBudget
    stats_max_iterations: int = 1000


class EngineDead(RuntimeError):
    """The engine thread stopped (failure or shutdown); the message says which."""


class Engine:
    def __init__(self, runner: ModelRunner, config: EngineConfig) -> None:
        self.runner = runner
        self.config = config
        self.scheduler = Scheduler(SchedulerLimits(config.max_batch_size, config.max_num_tokens, config.kv_budget))
        self.cache = runner.new_cache(max_slots=config.kv_budget.max_slots)
        self.running: list[Sequence] = []  # row i of the cache belongs to running[i]
        self.iteration = 0
        self._failures_in_a_row = 0

        # Everything below is shared with the callers' threads and guarded by `_lock`.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the engine waits here when idle
        self._ready = threading.Condition(self._lock)  # callers wait here for steps
        self._incoming: list[Sequence] = []
        self._cancels: set[int] = set()
        self._steps: list[Step] = []
        self._open_step: dict[int, int] = {}  # request id -> index of its unread, non-final step in `_steps`
        self._stats: deque[IterationStats] = deque(maxlen=max(1, config.stats_max_iterations))
        self._error: str | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="transformers-engine", daemon=True)
        self._thread.start()

    # -- callers' side ---------------------------------------------------------------------------------------------
    def submit(self, sequence: Sequence) -> None:
        with self._lock:
            self._raise_if_dead()
            self._incoming.append(sequence)
            self._work.notify()

    def cancel(self, request_id: int) -> None:
        with self._lock:
            self._cancels.add(request_id)
            self._work.notify()

    def wait_steps(self, timeout_s: float) -> list[Step]:
        """Block until steps are ready, the engine fails, or the timeout passes (after `stop`: nothing, no error)."""
        with self._lock:
            self._ready.wait_for(lambda: self._steps or self._error, timeout=max(0.0, timeout_s))
            if self._error and not self._steps:
                raise EngineDead(self._error)
            steps, self._steps = self._steps, []
            self._open_step.clear()
            return steps

    def take_stats(self) -> list[IterationStats]:
        with self._lock:
            stats = list(self._stats)
            self._stats.clear()
            return stats

    def queued(self) -> int:
        with self._lock:
            return len(self._incoming) + len(self.scheduler.waiting)

    @property
    def error(self) -> str | None:
        return self._error

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            self._stopping = True
            self._work.notify_all()
            self._ready.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _raise_if_dead(self) -> None:
        if self._error:
            raise EngineDead(self._error)
        if self._stopping:
            raise EngineDead("the engine is shut down")

    def _publish(self, steps: list[Step]) -> None:
        """Hand steps to the callers; a request's steps not yet read are merged, so a slow reader gets one step."""
        if not steps:
            return
        with self._lock:
            for step in steps:
                index = self._open_step.get(step.request_id)
                if index is None:
                    self._steps.append(step)
                    index = len(self._steps) - 1
                else:
                    _merge_step(self._steps[index], step)
                if step.is_final:
                    self._open_step.pop(step.request_id, None)
                else:
                    self._open_step[step.request_id] = index
            self._ready.notify_all()

    # -- engine thread ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with torch.inference_mode(), self.runner.attention_backends():
                while self._next_iteration():
                    pass
        except BaseException as exc:  # noqa: BLE001 - any failure ends the engine; callers learn why
            log.exception("transformers engine failed")
            with self._lock:
                self._error = f"engine failed: {type(exc).__name__}: {exc}"
                self._ready.notify_all()

    def _next_iteration(self) -> bool:
        with self._lock:
            while not (self._stopping or self._incoming or self._cancels or self.running or self.scheduler.waiting):
                self._work.wait()
            if self._stopping:
                return False
            incoming, self._incoming = self._incoming, []
            cancels, self._cancels = self._cancels, set()
        for sequence in incoming:
            self.scheduler.add(sequence)
        started = time.monotonic()
        self._publish(self._end_cancelled_and_expired(cancels, started))

        admitted = self.scheduler.admit(self.running)
        decoded = len(self.running)
        if self.running:
            # A failed forward of the whole batch is nobody's in particular: it stops the engine (see _run).
            logits = self.runner.decode(self.cache, [sequence.last_token for sequence in self.running])
            self._publish(self._accept(self.running, logits))
        for group in prefill_groups(admitted):
            self._prefill(group)
        self._free_finished_rows()
        self.iteration += 1
        self._record_stats(decoded, admitted)
        return True

    def _end_cancelled_and_expired(self, cancels: set[int], now: float) -> list[Step]:
        steps = []
        for sequence in [*self.scheduler.waiting, *self.running]:
            if sequence.request_id in cancels:
                sequence.finish(FinishReason.CANCELLED)
            elif sequence.deadline is not None and now >= sequence.deadline:
                sequence.finish(FinishReason.TIMED_OUT)
            else:
                continue
            steps.append(sequence.step([]))
        self.scheduler.remove_finished()
        self._free_finished_rows()
        return steps

    def _prefill(self, group: list[Sequence]) -> None:
        """Prefill a group into its own cache, then merge its rows into the batch; the batch's cache is untouched
        until the group has succeeded, so a failed prefill leaves nothing to undo."""
        try:
            logits, group_cache = self.runner.prefill([sequence.token_ids for sequence in group])
        except Exception as exc:  # noqa: BLE001 - whose it was is found out below
            if len(group) == 1:
                self._publish([self._fail(group[0], "prefill", exc)])
                return
            log.warning("prefill of %d requests failed (%s); each is tried alone", len(group), exc)
            for sequence in group:
                self._prefill([sequence])
            return
        self._publish(self._accept(group, logits, prefill=True))
        self.cache.append_rows(group_cache)
        self.running.extend(group)

    def _accept(self, sequences: list[Sequence], logits: torch.Tensor, prefill: bool = False) -> list[Step]:
        try:
            sampled: list = list(zip(*sample_next_tokens(logits, [s.sampling_state() for s in sequences])))
        except Exception as exc:  # noqa: BLE001 - sampled again row by row, so a failure is pinned on its own row
            log.warning("sampling %d rows failed (%s); each row is sampled alone", len(sequences), exc)
            sampled = [None] * len(sequences)
        steps = []
        for row, sequence in enumerate(sequences):
            try:
                steps.append(self._accept_row(sequence, logits[row], sampled[row], prefill))
                self._failures_in_a_row = 0
            except Exception as exc:  # noqa: BLE001 - this request's own failure
                steps.append(self._fail(sequence, "prefill" if prefill else "decode", exc))
        return steps

    def _accept_row(
        self, sequence: Sequence, logits: torch.Tensor, sampled: tuple[int, float | None] | None, prefill: bool
    ) -> Step:
        if sampled is None:
            (token,), (log_prob,) = sample_next_tokens(logits[None], [sequence.sampling_state()])
        else:
            token, log_prob = sampled
        step = sequence.accept(token, log_prob, self.runner.max_positions)
        # Logits only for requests that asked (NVIDIA's return_*_logits): the copies cost a vocabulary each.
        if sequence.want_generation_logits and step.token_ids:
            step.generation_logits = logits.float().cpu().numpy()[None, None]  # [beams, tokens, vocab]
        if prefill and sequence.want_context_logits:
            step.context_logits = self.runner.prompt_logits(sequence.token_ids[: sequence.prompt_len])
        return step

    def _fail(self, sequence: Sequence, stage: str, exc: Exception) -> Step:
        """End one request with an error step (its row, if any, is freed with the finished ones)."""
        log.error("request %s failed in %s: %s: %s", sequence.request_id, stage, type(exc).__name__, exc,
                  exc_info=exc)
        self._failures_in_a_row += 1
        if self._failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            raise RuntimeError(f"{self._failures_in_a_row} requests failed in a row, the last in {stage}: {exc}")
        sequence.finish(FinishReason.ERROR)
        step = sequence.step([])
        step.error = f"{stage} failed: {type(exc).__name__}: {exc}"
        return step

    def _free_finished_rows(self) -> None:
        finished = [row for row, sequence in enumerate(self.running) if sequence.is_finished]
        if not finished:
            return
        # The cache fills each hole with its last row; mirror that here so rows and sequences stay aligned.
        for source, target in self.cache.remove_rows(finished):
            self.running[target] = self.running[source]
        del self.running[len(self.running) - len(finished) :]

    def _record_stats(self, decoded: int, admitted: list[Sequence]) -> None:
        context_tokens = sum(sequence.prompt_len for sequence in admitted)
        slots = self.config.kv_budget.max_slots
        used = reserved_slots(self.running)
        gpu_bytes = None
        if self.runner.device.type == "cuda":
            gpu_bytes = torch.cuda.memory_allocated(self.runner.device)
        stats = IterationStats(
            timestamp=time.time(),
            iteration=self.iteration,
            active_requests=len(self.running),
            queued_requests=len(self.scheduler.waiting),
            max_active_requests=self.config.max_batch_size,
            scheduled_requests=decoded + len(admitted),
            context_requests=len(admitted),
            generation_requests=decoded,
            context_tokens=context_tokens,
            tokens_in_step=decoded + context_tokens,
            gpu_mem_bytes=gpu_bytes,
            # One "block" is one token slot of the budget; used = what the running requests reserve for their whole
            # life (rows x the longest prompt + max_tokens), which is what admission weighs a new request against.
            kv_cache=KvCacheStats(max_blocks=slots, free_blocks=slots - used, used_blocks=used, tokens_per_block=1),
        )
        with self._lock:
            self._stats.append(stats)


def _merge_step(pending: Step, step: Step) -> None:
    """Fold a request's newer step into its unread one: tokens, log probs and logits rows add up (logits along
    the token axis); what describes the request so far (finish, cumulative log prob, cache counts) is the newer."""
    pending.token_ids.extend(step.token_ids)
    if pending.log_probs is not None and step.log_probs is not None:
        pending.log_probs.extend(step.log_probs)
    if step.generation_logits is not None:
        if pending.generation_logits is None:
            pending.generation_logits = step.generation_logits
        else:
            pending.generation_logits = np.concatenate([pending.generation_logits, step.generation_logits], axis=1)
    if pending.context_logits is None:
        pending.context_logits = step.context_logits
    pending.cum_log_prob = step.cum_log_prob
    pending.is_final, pending.finish_reason = step.is_final, step.finish_reason
    pending.error = pending.error or step.error
    if step.kv_cache_alloc_total_blocks is not None:
        pending.kv_cache_alloc_new_blocks = step.kv_cache_alloc_new_blocks
        pending.kv_cache_reused_blocks = step.kv_cache_reused_blocks
        pending.kv_cache_alloc_total_blocks = step.kv_cache_alloc_total_blocks
