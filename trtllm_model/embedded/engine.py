"""The engine loop, on its own thread: each iteration decodes the running batch, prefills the requests that join,
samples, and publishes the new tokens as steps. Callers talk to it through `submit`, `cancel` and `wait_steps`.

Requests join and leave only between iterations (in-flight batching): a request that finishes or is cancelled
frees its row at once, and a new one is prefilled at the next iteration instead of waiting for the batch to drain.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from ..executor_interface import FinishReason, IterationStats, KvCacheStats, Step
from .runner import ModelRunner
from .sampling import sample_next_tokens
from .scheduler import Scheduler, SchedulerLimits, prefill_groups
from .sequence import Sequence

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineConfig:
    max_batch_size: int
    max_num_tokens: int
    stats_max_iterations: int = 1000


class EngineDead(RuntimeError):
    """The engine thread stopped (failure or shutdown); the message says which."""


class Engine:
    def __init__(self, runner: ModelRunner, config: EngineConfig) -> None:
        self.runner = runner
        self.config = config
        self.scheduler = Scheduler(SchedulerLimits(config.max_batch_size, config.max_num_tokens))
        self.cache = runner.new_cache()
        self.running: list[Sequence] = []  # row i of the cache belongs to running[i]
        self.iteration = 0

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
                    pending = self._steps[index]
                    pending.token_ids.extend(step.token_ids)
                    if pending.log_probs is not None and step.log_probs is not None:
                        pending.log_probs.extend(step.log_probs)
                    pending.cum_log_prob = step.cum_log_prob
                    pending.is_final, pending.finish_reason = step.is_final, step.finish_reason
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

        admitted = self.scheduler.admit(len(self.running))
        decoded = len(self.running)
        if self.running:
            logits = self.runner.decode(self.cache, [sequence.last_token for sequence in self.running])
            self._publish(self._accept(self.running, logits))
        for group in prefill_groups(admitted):
            logits, group_cache = self.runner.prefill([sequence.token_ids for sequence in group])
            self._publish(self._accept(group, logits, prefill=True))
            self.cache.append_rows(group_cache)
            self.running.extend(group)
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

    def _accept(self, sequences: list[Sequence], logits: torch.Tensor, prefill: bool = False) -> list[Step]:
        tokens, log_probs = sample_next_tokens(logits, [sequence.sampling_state() for sequence in sequences])
        max_positions = self.runner.max_positions
        steps = [sequence.accept(t, lp, max_positions) for sequence, t, lp in zip(sequences, tokens, log_probs)]
        for row, (sequence, step) in enumerate(zip(sequences, steps, strict=True)):
            # Logits only for requests that asked (NVIDIA's return_*_logits): the copies cost a vocabulary each.
            if sequence.want_generation_logits and step.token_ids:
                step.generation_logits = logits[row].float().cpu().numpy()[None, None]  # [beams, tokens, vocab]
            if prefill and sequence.want_context_logits:
                step.context_logits = self.runner.prompt_logits(sequence.token_ids[: sequence.prompt_len])
        return steps

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
        rows, columns = self.cache.capacity
        slots = rows * columns
        used = sum(self.cache.lengths)
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
            # One "block" is one token slot of the preallocated batch buffer; used = real tokens held.
            kv_cache=KvCacheStats(max_blocks=slots, free_blocks=slots - used, used_blocks=used, tokens_per_block=1),
        )
        with self._lock:
            self._stats.append(stats)
