"""The deterministic in-flight batching engine behind both fakes (the executor binding and the LLM API).

Token rule (so tests can predict every token): sequence `s` of a request with prompt `p` produces, at output
position `i`, `(p[-1] + 1 + i + 7 * s) % vocab_size`. With beam search, beam `b` of a request that has `n` tokens
so far is `[(p[-1] + 1 + j + b * n) % vocab_size for j in range(n)]`: beams > 0 rewrite earlier tokens each step.
The end token is not part of the output; stop words are. A bad word of one token is skipped (the next id is used).
An embedding bias with a positive entry forces its argmax. Log prob of token t: `-((t % 5) + 1) / 10`.

Environment (read when an engine starts): FAKE_TRTLLM_STEP_MS (default 2) is the iteration period;
FAKE_TRTLLM_FAIL_TOKEN=<id>: a request whose prompt contains that id fails with an error after its first token.
FAKE_TRTLLM_FATAL_TOKEN=<id>: such a request kills the engine: every request gets an error, `dead` is set and the
engine takes no more work (as after a fatal CUDA error).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime


def fake_token(prompt: list[int], index: int, vocab_size: int, offset: int = 0) -> int:
    return (prompt[-1] + 1 + index + offset) % vocab_size


def fake_log_prob(token: int) -> float:
    return -((token % 5) + 1) / 10


@dataclass
class Job:
    """One request as the fake engine sees it; `sequences` holds every sequence (or beam) generated so far."""

    job_id: int
    prompt: list[int]
    max_tokens: int
    beam_width: int = 1
    num_sequences: int = 1
    end_id: int | None = None
    min_tokens: int = 0
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    forced_token: int | None = None
    deadline: float | None = None
    error: str | None = None  # set at submit: the request fails before any token
    sequences: list[list[int]] = field(default_factory=list)
    finished: list[str | None] = field(default_factory=list)
    cancelled: bool = False
    fail_after_first: bool = False

    def __post_init__(self) -> None:
        width = self.beam_width if self.beam_width > 1 else self.num_sequences
        self.sequences = [[] for _ in range(width)]
        self.finished = [None] * width


@dataclass
class Update:
    """What one iteration did to a job: new tokens per sequence, finish reason names, or an error."""

    job: Job
    new_tokens: list[list[int]]
    finished_now: list[int]  # sequence indices that finished in this iteration
    error: str | None = None
    # Finish reasons as of this iteration: a consumer that lags behind the engine must not see later ones.
    finished: list[str | None] = field(init=False)

    def __post_init__(self) -> None:
        self.finished = list(self.job.finished)

    @property
    def job_done(self) -> bool:
        return self.error is not None or all(reason is not None for reason in self.finished)


@dataclass
class Stat:
    timestamp: str
    iteration: int
    active: int
    queued: int
    max_active: int
    context_requests: int
    generation_requests: int
    context_tokens: int


class FakeEngine:
    def __init__(self, vocab_size: int, max_batch_size: int, on_update: Callable[[Update], None], max_stats: int):
        self.vocab_size = vocab_size
        self.max_batch_size = max_batch_size
        self.cond = threading.Condition()
        self.stats: deque[Stat] = deque(maxlen=max(max_stats, 0) or None)
        self.keep_stats = max_stats > 0
        self._on_update = on_update
        self._step_s = float(os.environ.get("FAKE_TRTLLM_STEP_MS", "2")) / 1000.0
        # A stats call that blocks (the real LLM.get_stats waits its whole timeout when iteration stats are off).
        self.stats_block_s = float(os.environ.get("FAKE_TRTLLM_STATS_BLOCK_S", "0"))
        fail = os.environ.get("FAKE_TRTLLM_FAIL_TOKEN", "")
        self._fail_token = int(fail) if fail else None
        fatal = os.environ.get("FAKE_TRTLLM_FATAL_TOKEN", "")
        self._fatal_token = int(fatal) if fatal else None
        self.dead: str | None = None
        self._waiting: deque[Job] = deque()
        self._active: dict[int, Job] = {}
        self._iteration = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="fake-trtllm-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self.cond:
            if self._stopping or self.dead:
                raise RuntimeError(f"[TensorRT-LLM][ERROR] Assertion failed: Shutdown called {self.dead or ''}")
            job.fail_after_first = self._fail_token is not None and self._fail_token in job.prompt
            self._waiting.append(job)
            self.cond.notify_all()

    def cancel(self, job_id: int) -> None:
        with self.cond:
            for job in [*self._waiting, *self._active.values()]:
                if job.job_id == job_id:
                    job.cancelled = True
            self.cond.notify_all()

    def shutdown(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    @property
    def stopped(self) -> bool:
        return self._stopping

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self._stopping and not self._waiting and not self._active:
                    self.cond.wait()
                if self._stopping:
                    return
            time.sleep(self._step_s)
            with self.cond:
                if self._stopping:
                    return
                self._iterate()
                self.cond.notify_all()

    def _iterate(self) -> None:
        self._iteration += 1
        if self._fatal_token is not None and any(self._fatal_token in job.prompt for job in self._active.values()):
            self._die("[TensorRT-LLM][ERROR] CUDA runtime error: an illegal memory access was encountered (fake)")
            return
        context = [job for job in self._waiting][: max(self.max_batch_size - len(self._active), 0)]
        for job in context:
            self._waiting.remove(job)
            self._active[job.job_id] = job
        for job in [job for job in self._waiting if job.cancelled]:
            self._waiting.remove(job)
            self._active[job.job_id] = job
        for job_id, job in list(self._active.items()):
            update = self._advance(job)
            self._on_update(update)
            if update.job_done:
                del self._active[job_id]
        if self.keep_stats:
            now = datetime.now()
            self.stats.append(
                Stat(
                    timestamp=now.strftime("%m-%d-%Y %H:%M:%S.%f"),
                    iteration=self._iteration,
                    active=len(self._active),
                    queued=len(self._waiting),
                    max_active=self.max_batch_size,
                    context_requests=len(context),
                    generation_requests=len(self._active) - len([j for j in context if j.job_id in self._active]),
                    context_tokens=sum(len(job.prompt) for job in context),
                )
            )

    def _die(self, reason: str) -> None:
        self.dead = reason
        self._stopping = True
        for job in [*self._active.values(), *self._waiting]:
            self._on_update(Update(job, [[] for _ in job.sequences], [], error=reason))
        self._active.clear()
        self._waiting.clear()

    def _advance(self, job: Job) -> Update:
        width = len(job.sequences)
        if job.error is not None:
            return Update(job, [[] for _ in range(width)], [], error=job.error)
        if job.fail_after_first and any(job.sequences):
            return Update(job, [[] for _ in range(width)], [], error="[TensorRT-LLM][ERROR] fake engine failure")
        stop_reason = "CANCELLED" if job.cancelled else None
        if stop_reason is None and job.deadline is not None and time.monotonic() >= job.deadline:
            stop_reason = "TIMED_OUT"
        if stop_reason is not None:
            finished_now = [i for i, reason in enumerate(job.finished) if reason is None]
            for i in finished_now:
                job.finished[i] = stop_reason
            return Update(job, [[] for _ in range(width)], finished_now)
        if job.beam_width > 1:
            return self._advance_beams(job)
        new_tokens: list[list[int]] = []
        finished_now: list[int] = []
        for index, sequence in enumerate(job.sequences):
            if job.finished[index] is not None:
                new_tokens.append([])
                continue
            token = self._next_token(job, sequence, offset=7 * index)
            reason = None
            if token == job.end_id and len(sequence) >= job.min_tokens:
                reason, new = "END_ID", []
            else:
                sequence.append(token)
                new = [token]
                if any(word and sequence[-len(word):] == word for word in job.stop_words):
                    reason = "STOP_WORDS"
                elif len(sequence) >= job.max_tokens:
                    reason = "LENGTH"
            new_tokens.append(new)
            if reason is not None:
                job.finished[index] = reason
                finished_now.append(index)
        return Update(job, new_tokens, finished_now)

    def _advance_beams(self, job: Job) -> Update:
        n = len(job.sequences[0]) + 1
        for beam, sequence in enumerate(job.sequences):
            sequence[:] = [fake_token(job.prompt, j, self.vocab_size, beam * n if beam else 0) for j in range(n)]
        reason = None
        if job.end_id is not None and job.sequences[0][-1] == job.end_id and n > job.min_tokens:
            reason = "END_ID"
            for sequence in job.sequences:
                sequence.pop()
        elif any(word and job.sequences[0][-len(word):] == word for word in job.stop_words):
            reason = "STOP_WORDS"
        elif n >= job.max_tokens:
            reason = "LENGTH"
        finished_now = []
        if reason is not None:
            finished_now = list(range(len(job.sequences)))
            job.finished = [reason] * len(job.sequences)
        return Update(job, [list(sequence) for sequence in job.sequences], finished_now)

    def _next_token(self, job: Job, sequence: list[int], offset: int) -> int:
        if job.forced_token is not None:
            return job.forced_token
        token = fake_token(job.prompt, len(sequence), self.vocab_size, offset)
        single_bad = {word[0] for word in job.bad_words if len(word) == 1}
        while token in single_bad:
            token = (token + 1) % self.vocab_size
        return token
