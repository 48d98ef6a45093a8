"""A model-free executor: deterministic tokens at a set pace, with in-flight batching and fault injection.

Token `i` (0-based) of a request is `(input_ids[-1] + 1 + i) % vocab_size`, so a test can predict every token.
Each step every active request gains one token; waiting requests join at the next step while slots are free.

Paged KV cache (on when NVIDIA's `max_tokens_in_paged_kv_cache` is set): a fixed pool of
max_tokens_in_paged_kv_cache / synthetic_tokens_per_block blocks. A sequence holds ceil(length / tokens_per_block)
blocks (prompt plus tokens so far), taken as it grows and returned when it ends. Admission follows TensorRT-LLM's
default scheduler policy, GUARANTEED_NO_EVICT: a waiting request joins only while the pool can hold every admitted
sequence at its full length (prompt + max_tokens), first come first served; otherwise it waits. Each iteration
reports the pool as IterationStats.kv_cache (NVIDIA's nv_trt_llm_kv_cache_block_metrics). A request that could
never fit (prompt + max_tokens beyond the whole pool) is rejected at enqueue.

Faults (GenerationRequest.faults, from request parameters `synthetic_fault_<name>`, e.g. synthetic_fault_crash_at=3):
  reject           enqueue raises RequestRejected
  error_at=N       the request ends with an error step after N tokens
  crash_at=N       the engine thread dies after this request's N-th token (the executor is dead afterwards)
  stall_ms=N       the engine thread sleeps N ms before each step while this request is active
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..executor_interface import (
    Executor,
    ExecutorError,
    FinishReason,
    GenerationRequest,
    IterationStats,
    KvCacheStats,
    RequestRejected,
    Step,
)
from ..params import Params
from ..pipeline.request_checks import check_request

PARAMETERS = frozenset({"synthetic_step_ms", "synthetic_vocab_size", "synthetic_tokens_per_block"})
FAULTS = ("reject", "error_at", "crash_at", "stall_ms")


def synthetic_token(input_ids: list[int], index: int, vocab_size: int) -> int:
    """The token a synthetic request produces at position `index` of its output."""
    return (input_ids[-1] + 1 + index) % vocab_size


@dataclass
class _Sequence:
    request_id: int
    request: GenerationRequest
    generated: int = 0
    cancelled: bool = False
    started: float = field(default_factory=time.monotonic)
    blocks: int = 0  # KV-cache blocks held now


class PagedKvCache:
    """The block pool's accounting: blocks held now, blocks promised to admitted sequences at full length."""

    def __init__(self, max_blocks: int, tokens_per_block: int) -> None:
        self.max_blocks = max_blocks
        self.tokens_per_block = tokens_per_block
        self.used = 0
        self.reserved = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_block)

    def full_length_blocks(self, request: GenerationRequest) -> int:
        return self.blocks_for(len(request.input_ids) + request.max_tokens)

    def admit(self, seq: _Sequence) -> bool:
        """Take the prompt's blocks if every admitted sequence can still reach its full length; else False."""
        need = self.full_length_blocks(seq.request)
        if self.reserved + need > self.max_blocks:
            return False
        self.reserved += need
        self.grow(seq)
        return True

    def grow(self, seq: _Sequence) -> None:
        """Blocks for the sequence's length now (prompt + tokens so far); a new block each tokens_per_block tokens."""
        blocks = self.blocks_for(len(seq.request.input_ids) + seq.generated)
        self.used += blocks - seq.blocks
        seq.blocks = blocks

    def release(self, seq: _Sequence) -> None:
        self.used -= seq.blocks
        self.reserved -= self.full_length_blocks(seq.request)
        seq.blocks = 0

    def stats(self) -> KvCacheStats:
        return KvCacheStats(max_blocks=self.max_blocks, free_blocks=self.max_blocks - self.used,
                            used_blocks=self.used, tokens_per_block=self.tokens_per_block)


class SyntheticTokenizer:
    """Byte-level tokenizer for the text interface: ids 0-255 are bytes; 256 is EOS; higher ids are words."""

    eos_token_id = 256
    pad_token_id = 256

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: object) -> str:
        out = bytearray()
        for token in token_ids:
            if token < 256:
                out.append(token)
            elif token > 256:
                out.extend(f" w{token}".encode())
            elif not skip_special_tokens:
                out.extend(b"</s>")
        return out.decode("utf-8", errors="replace")


class SyntheticExecutor(Executor):
    optional_inputs = frozenset({"top_log_probs"})

    def __init__(
        self, step_ms: float = 10.0, max_batch_size: int = 64, vocab_size: int = 32000,
        kv_cache_tokens: int | None = None, tokens_per_block: int = 32,
    ) -> None:
        self.step_s = step_ms / 1000.0
        self.max_batch_size = max_batch_size
        self.vocab_size = vocab_size
        self.kv_cache = None if kv_cache_tokens is None else PagedKvCache(kv_cache_tokens // tokens_per_block, tokens_per_block)
        self._ids = itertools.count(1)
        # One lock, two conditions: work arriving wakes only the engine, steps ready wake only the awaiters.
        mutex = threading.RLock()
        self._lock = threading.Condition(mutex)
        self._work_arrived = threading.Condition(mutex)
        self._waiting: deque[_Sequence] = deque()
        self._active: dict[int, _Sequence] = {}
        self._ready: list[Step] = []
        self._stats: list[IterationStats] = []
        self._iteration = 0
        self._dead: str | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="synthetic-engine", daemon=True)
        self._thread.start()

    # -- interface -------------------------------------------------------------------------------------------
    @property
    def batch_slots(self) -> int:
        return self.max_batch_size

    def enqueue(self, request: GenerationRequest) -> int:
        if "reject" in request.faults:
            raise RequestRejected("synthetic_fault: request rejected by the executor")
        if request.beam_width != 1:
            raise RequestRejected("beam_width: the synthetic executor supports only 1", unsupported=True)
        check_request(request, self.vocab_size, self.max_logits_bytes)
        if self.kv_cache and self.kv_cache.full_length_blocks(request) > self.kv_cache.max_blocks:
            raise RequestRejected(
                f"max_tokens: prompt + max_tokens ({len(request.input_ids)} + {request.max_tokens} tokens) needs "
                f"{self.kv_cache.full_length_blocks(request)} KV-cache blocks; the pool has {self.kv_cache.max_blocks}"
            )
        if request.num_return_sequences != 1:
            raise RequestRejected("num_return_sequences: the synthetic executor returns one sequence", unsupported=True)
        with self._lock:
            if self._dead:
                raise ExecutorError(self._dead)
            request_id = next(self._ids)
            self._waiting.append(_Sequence(request_id, request))
            self._work_arrived.notify()
            return request_id

    def await_steps(self, timeout_s: float) -> list[Step]:
        with self._lock:
            if not self._ready and not self._dead:
                self._lock.wait(timeout_s)
            if self._dead and not self._ready:
                raise ExecutorError(self._dead)
            steps, self._ready = self._ready, []
            return steps

    def cancel(self, request_id: int) -> None:
        with self._lock:
            for seq in itertools.chain(self._active.values(), self._waiting):
                if seq.request_id == request_id:
                    seq.cancelled = True  # seen at the next step; an engine with this request is not idle

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
            self._work_arrived.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def health_error(self) -> str | None:
        return self._dead

    def iteration_stats(self) -> list[IterationStats]:
        with self._lock:
            stats, self._stats = self._stats, []
            return stats

    def tokenizer(self) -> SyntheticTokenizer:
        return SyntheticTokenizer()

    # -- engine thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a dead engine must be visible, never silent
            with self._lock:
                self._dead = f"synthetic engine thread died: {exc}"
                self._lock.notify_all()

    def _loop(self) -> None:
        next_step = time.monotonic()
        while True:
            with self._lock:
                idle = False
                while not self._stopping and not self._active and not self._waiting:
                    self._work_arrived.wait()  # idle: sleep until work arrives, no polling
                    idle = True
                if self._stopping:
                    return
                if idle:
                    # An idle engine starts on a request as it arrives (as a C++ engine would): the first step is
                    # due one step after the arrival, not after this Python thread next gets the GIL.
                    next_step = self._waiting[0].started
                stall = self._admit_and_stall_ms()
            if stall:
                time.sleep(stall / 1000.0)
            next_step += self.step_s
            delay = next_step - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_step = time.monotonic()  # fell behind: don't burst to catch up
            with self._lock:
                if self._stopping:
                    return
                self._step()
                self._lock.notify_all()

    def _admit_and_stall_ms(self) -> float:
        while self._waiting and len(self._active) < self.max_batch_size:
            if self.kv_cache and not self.kv_cache.admit(self._waiting[0]):
                break  # first come first served: the head waits for blocks, nobody overtakes it
            seq = self._waiting.popleft()
            self._active[seq.request_id] = seq
        return max((float(s.request.faults.get("stall_ms", 0)) for s in self._active.values()), default=0.0)

    def _step(self) -> None:
        now = time.monotonic()
        self._iteration += 1
        for seq in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(seq)
            self._ready.append(Step(seq.request_id, is_final=True, finish_reason=FinishReason.CANCELLED))
        for request_id, seq in list(self._active.items()):
            step = self._advance(seq, now)
            self._ready.append(step)
            if step.is_final:
                del self._active[request_id]
                if self.kv_cache:
                    self.kv_cache.release(seq)
            elif self.kv_cache:
                self.kv_cache.grow(seq)
        self._stats.append(
            IterationStats(
                timestamp=time.time(),
                iteration=self._iteration,
                active_requests=len(self._active),
                queued_requests=len(self._waiting),
                max_active_requests=self.max_batch_size,
                scheduled_requests=len(self._active),
                tokens_in_step=len(self._active),
                kv_cache=self.kv_cache.stats() if self.kv_cache else None,
            )
        )
        del self._stats[:-1000]

    def _advance(self, seq: _Sequence, now: float) -> Step:
        req = seq.request
        if seq.cancelled:
            return Step(seq.request_id, is_final=True, finish_reason=FinishReason.CANCELLED)
        if req.allotted_time_ms is not None and (now - seq.started) * 1000 >= req.allotted_time_ms:
            return Step(seq.request_id, is_final=True, finish_reason=FinishReason.TIMED_OUT)
        if "error_at" in req.faults and seq.generated >= int(req.faults["error_at"]):
            return Step(seq.request_id, is_final=True, finish_reason=FinishReason.ERROR, error="synthetic_fault: injected error")
        if "crash_at" in req.faults and seq.generated >= int(req.faults["crash_at"]):
            raise RuntimeError("synthetic_fault: injected engine crash")
        token = synthetic_token(req.input_ids, seq.generated, self.vocab_size)
        seq.generated += 1
        step = Step(seq.request_id, [token])
        if req.return_log_probs:
            step.log_probs = [-0.5]
            step.cum_log_prob = -0.5 * seq.generated
        if req.num_top_log_probs:  # the token itself first (-0.5), then the ids after it, each one less likely
            step.top_log_probs = [[((token + j) % self.vocab_size, -0.5 - j) for j in range(req.num_top_log_probs)]]
        if req.end_id is not None and token == req.end_id and seq.generated >= (req.min_tokens or 0):
            step.is_final, step.finish_reason = True, FinishReason.END_ID
        elif req.stop_words and any(self._ends_with(seq, word) for word in req.stop_words):
            step.is_final, step.finish_reason = True, FinishReason.STOP_WORDS
        elif seq.generated >= req.max_tokens:
            step.is_final, step.finish_reason = True, FinishReason.LENGTH
        return step

    def _ends_with(self, seq: _Sequence, word: list[int]) -> bool:
        start = seq.generated - len(word)
        if not word or start < 0:
            return False
        return all(synthetic_token(seq.request.input_ids, start + i, self.vocab_size) == t for i, t in enumerate(word))


def check_parameters(params: Params) -> None:
    """Read every parameter as `create` does: ConfigError names the first bad one."""
    create(params).shutdown()


def create(params: Params) -> SyntheticExecutor:
    return SyntheticExecutor(
        step_ms=params.float("synthetic_step_ms", 10.0, minimum=0.0),
        max_batch_size=params.int("max_batch_size", 64, minimum=1),
        vocab_size=params.int("synthetic_vocab_size", 32000, minimum=2),
        kv_cache_tokens=params.int("max_tokens_in_paged_kv_cache", None, minimum=1),
        tokens_per_block=params.int("synthetic_tokens_per_block", 32, minimum=1),
    )
