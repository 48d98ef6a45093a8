"""The engine loop, on its own thread: each iteration decodes the running batch, prefills the requests that join,
samples, and publishes the new tokens as steps. Callers talk to it through `submit`, `cancel` and `wait_steps`; or
the engine hands each iteration's steps to `send_steps` itself, on its own thread (the worker process, which sends
them to the stub: no second thread there waits for the steps and takes the interpreter's lock from the engine to
pack them).

Requests join and leave only between iterations (in-flight batching): a request that finishes or is cancelled
frees its KV blocks at once, and a new one is prefilled at the next iteration instead of waiting for the batch to
drain. Keys and values live in a block pool (`kv_cache`, `block_manager`): a prompt whose leading full blocks are
cached is prefilled only from the first uncached token (`enable_kv_cache_reuse`). The scheduler decides who runs:
it grows the decoding sequences' blocks, preempts the newest when the pool runs out (recomputed later), and hands
out prefill chunks within the step's token budget; a sequence whose chunk ends its prompt samples its first token
and decodes from the next iteration on.

Overlapped steps (`overlap_steps`, the default on CUDA): a step's tokens are sampled on the device and fed to the
next step from there, so the engine launches step n+1 before it reads step n's tokens, and builds inputs and accepts
tokens while the device computes (as vLLM's async scheduling and SGLang's overlap scheduler do; `steps_in_flight`
launches them and starts their copies to the host). A row fed after its request ended on a token not yet read is
computed for nothing and dropped. Requests whose sampling reads their tokens so far (guides, bias, penalties, bad
words) or that return logits are stepped plainly: the in-flight step's tokens are read first. So is a step that
might have to preempt (a preempted sequence's unread token, and its seeded draw, would be lost).

Several greedy decode steps an iteration (`decode_steps`, with overlapped steps; 4 on CUDA): while the batch only
decodes, nothing waits to join and every row is a plain argmax, an iteration launches that many steps at once
(`ModelRunner.decode_greedy`: one CUDA graph, each step fed the last one's argmax on the device, its inputs advanced
there), each row's blocks grown for them first. Scheduling, building inputs and launching are then paid once for them,
and their tokens are read together, one step per request. On an H200's host a 256-stream step's host work outlasted
its GPU time; this spreads it over the steps.

A failure the engine can pin on one request (its prefill, retried alone when it was part of a group; its sampling,
retried row by row; its context logits) fails that request with an error step and frees its blocks; the batch
goes on (a prefill writes only its own new blocks, and a block becomes findable by other prompts only once
written, so a failed or cancelled request leaves nothing another can read). What a request carries can fail that
request only: a row whose guide, bans and bias allow no token ends its request with a client error
(`Step.client_error`), however many such requests come in a row. Only the engine's own faults stop it (a failed
forward of the whole batch's decode, a device error): every open request then ends with the engine's error.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..executor_interface import FinishReason, IterationStats, KvCacheStats, Step
from .block_manager import BlockManager
from .kv_budget import KvBudget
from .runner import ModelRunner
from .sampling import NO_ALLOWED_TOKEN, sample_next_tokens
from .scheduler import Scheduler, SchedulerLimits, prefill_groups
from .sequence import FINISHED, Sequence
from .step_budget import StepBudget
from .steps_in_flight import GreedySteps, StepInFlight, StepLauncher
from .transfers import to_device

log = logging.getLogger(__name__)

# Prompt tokens a decode step's power-of-two buckets take beside its decoding rows (they go up to max_batch_size + this
# many rows); beyond them, up to max_num_tokens rows, the runner's joined buckets (`decode_graphs.JoinedBuckets`).
GRAPH_PREFILL_ROWS = 256

# EngineConfig.decode_steps on CUDA, where an iteration's host work outlasted a decode step's GPU time at 256 streams
# (H200, docs/performance.md).
DEFAULT_CUDA_DECODE_STEPS = 4


@dataclass(slots=True)
class EngineConfig:
    max_batch_size: int
    max_num_tokens: int
    kv_budget: KvBudget
    stats_max_iterations: int = 1000
    enable_kv_cache_reuse: bool = True  # NVIDIA's name: prefix caching over full blocks
    # A step that prefills beside decoding streams takes at most this many times a decode-only step (step_budget.py);
    # <= 1: off, every step may prefill max_num_tokens.
    prefill_stall_factor: float = 0.0
    # Launch step n+1 before the host reads step n's tokens (fed to it on the device): the host's work of a step
    # (building inputs, accepting tokens) runs while the device computes. On CPU the forward runs on this thread,
    # so there is nothing to overlap (the executor leaves it off there).
    overlap_steps: bool = False
    # With overlapped steps: greedy decode steps launched at once while the batch only decodes, nothing waits to join
    # and every row is a plain argmax (`_greedy_steps_ahead`), so an iteration's host work (scheduling, building
    # inputs, launching) is paid once for all of them; their tokens are read together. 1: one step an iteration.
    decode_steps: int = 1


def default_decode_steps(device: torch.device, decode_steps: int | None) -> int:
    """`decode_steps` as given, else the device's default: `DEFAULT_CUDA_DECODE_STEPS` on CUDA; 1 on the CPU, where a
    forward runs on the engine's own thread and no step overlaps another."""
    if decode_steps is not None:
        return decode_steps
    return DEFAULT_CUDA_DECODE_STEPS if device.type == "cuda" else 1


class EngineDead(RuntimeError):
    """The engine thread stopped (failure or shutdown); the message says which."""


class Engine:
    def __init__(self, runner: ModelRunner, config: EngineConfig,
                 send_steps: Callable[[list[Step]], None] | None = None) -> None:
        """`send_steps`: called on the engine thread with each batch of steps, instead of `wait_steps` handing them
        out (which then returns none, early only when the engine fails)."""
        self.runner = runner
        self.config = config
        self._send_steps = send_steps
        budget = config.kv_budget
        self.blocks = BlockManager(budget.num_blocks, budget.block_size, config.enable_kv_cache_reuse)
        runner.allocate_kv_pool(budget.num_blocks, budget.block_size)
        self._host_bytes = host_memory_bytes(runner)
        self.scheduler = Scheduler(SchedulerLimits(config.max_batch_size, config.max_num_tokens), self.blocks)
        self.step_budget = StepBudget(config.max_num_tokens, config.prefill_stall_factor)
        self.running: list[Sequence] = []
        self._timed: list[Sequence] = []  # sequences with a deadline (allotted_time_ms), dropped once they end
        # With overlap_steps: the launched steps whose tokens the host has not read yet, oldest first (the last one is
        # what the next step feeds from).
        self.in_flight: list[StepInFlight] = []
        self.launcher = StepLauncher(runner, config.max_batch_size)
        self.iteration = 0
        self.phase_seconds: dict[str, float] = {}  # engine thread's time per phase of its iterations, summed

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
        self._warm = threading.Event()  # set once the warm-up is over, done or failed (`wait_warm`)
        self._froze_gc = False  # the warm-up took what loading left out of the collector's reach (CUDA)
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

    def post(self, steps: list[Step]) -> None:
        """Hand out steps made beside the engine (a guided request refused or cancelled before it got here)."""
        self._publish(steps)

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

    def wait_warm(self) -> None:
        """Returns once the warm-up (`_warm_up`: CUDA graphs, compiled prompt forwards) is done; raises `EngineDead`
        if it failed (the engine's thread has then ended). Whoever reports the engine ready waits here first: a model
        that is ready while its graphs are still being captured (26-31 s for 221 graphs on an H100) holds its first
        requests that long, and one whose capture fails is ready and then fails every request."""
        self._warm.wait()
        self._raise_if_dead()

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
        if self._send_steps is not None:
            self._send_steps(steps)
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
                self._warm_up()
                self._warm.set()
                while self._next_iteration():
                    pass
        except BaseException as exc:  # noqa: BLE001 - any failure ends the engine; callers learn why
            log.exception("transformers engine failed")
            with self._lock:
                self._error = f"engine failed: {type(exc).__name__}: {exc}"
                self._ready.notify_all()
        finally:
            self._warm.set()  # after the error is set: a failed warm-up is read by `wait_warm`
            if self._froze_gc:
                # What the warm-up froze goes back to the collector when the engine ends: frozen objects are never
                # freed, and the extensions' leak reports (nanobind) at the interpreter's exit would name them.
                gc.unfreeze()

    def _warm_up(self) -> None:
        """Before the first request (`wait_warm`): the decode steps' CUDA graphs and the prompt forwards' compiles,
        if the runner has them."""
        started = time.monotonic()
        greedy_steps = self.config.decode_steps if self.config.overlap_steps else 1
        captured = self.runner.capture_decode_graphs(self.config.max_batch_size + GRAPH_PREFILL_ROWS, greedy_steps,
                                                     self.config.max_batch_size, self.config.max_num_tokens)
        if captured:
            log.info("captured %d decode graphs in %.1f s", captured, time.monotonic() - started)
        started = time.monotonic()
        # A prompt forward's tokens: an iteration's budget, plus the padding that one forward fewer is worth.
        max_tokens = self.config.max_num_tokens + int(self.runner.prefill_forward_cost_tokens)
        if self.runner.warm_up_prefill(max_tokens, self.config.max_batch_size):
            log.info("compiled the prompt forwards in %.1f s", time.monotonic() - started)
        if self.runner.device.type == "cuda":
            # What loading, compiling and capturing left goes out of the collector's reach (as vLLM does after its
            # capture): a full collection walks every object, about 0.2 s for the loaded model alone on this
            # project's CPU machine, and one landing mid-run stalls every stream.
            gc.collect()
            gc.freeze()
            self._froze_gc = True

    def _next_iteration(self) -> bool:
        with self._lock:
            # A partly prefilled prompt is work too: alone on the engine, its next chunk must not wait for new work.
            while not (self._stopping or self._incoming or self._cancels or self.running or self.scheduler.waiting
                       or self.scheduler.prefilling or self.in_flight):
                self._work.wait()
            if self._stopping:
                return False
            incoming, self._incoming = self._incoming, []
            cancels, self._cancels = self._cancels, set()
        # Phases: schedule (cancels, admission), decode (inputs and the forward's launch), sample (on CUDA also the
        # wait for the forward), accept (each row's token, stop checks, steps out), prefill (all of it, its sampling
        # included); the engine thread's seconds in each are summed in `phase_seconds`. With overlapped steps,
        # "accept" takes the previous step's tokens while this one runs, and "sample" only launches the sampling.
        started = time.monotonic()
        lap = time.perf_counter()
        launches_before = self.launcher.launches
        for sequence in incoming:
            sequence.overlappable = sequence.may_overlap()
            self.scheduler.add(sequence)
            if sequence.deadline is not None:
                self._timed.append(sequence)
        self._publish(self._end_cancelled_and_expired(cancels, started))
        if self.in_flight and not self._may_overlap():
            self._read_in_flight()
        # A sequence whose tokens on the device already end it is not fed again: it ends when they are read.
        ending, decoding = [], []
        for sequence in self.running:
            (ending if sequence.ends_once_read(self.runner.max_positions) else decoding).append(sequence)
        decoding = self.scheduler.make_room_for_decode(decoding)  # preempted ones wait again
        self.running = [*decoding, *ending]
        # The ending ones keep their seats until their tokens are read.
        admitted = self.scheduler.admit(self.running, self.step_budget.prefill_tokens(len(decoding)))
        context_tokens = sum(sequence.prefill_len for sequence in admitted)  # what the prefills compute
        decoded, joined = len(decoding), len(admitted)
        joining, admitted = self._prefills_in_decode(admitted, decoding)
        greedy = self._greedy_steps_ahead(decoding, joining or admitted)
        lap = self._lap("schedule", lap)
        logits, done, launched = None, [], []
        if greedy:
            fed = self.in_flight[-1].tokens if self.in_flight else None
            launched = self.launcher.greedy_steps(decoding, fed, greedy)
            for sequence in decoding:
                self._computed(sequence, len(sequence.token_ids))
            lap = self._lap("decode", lap)
        elif decoding or joining:
            logits, prefilled = self._decode(decoding, joining)
            if not prefilled:  # none, or their forward failed: they are prefilled apart below
                admitted = [*joining, *admitted]
            for sequence in decoding:
                self._computed(sequence, len(sequence.token_ids))
            if logits is not None:
                logits, done = self._prompts_done(prefilled, logits, len(decoding))
            lap = self._lap("decode", lap)
        if admitted and self.config.overlap_steps:
            # The prompts prefilled apart join this step's rows: their first tokens are sampled on the device with
            # the decoding rows' and fed to the next step from there, so the host does not wait for their forwards.
            apart, apart_logits = self._prompt_forwards(prefill_groups(admitted, self.runner.prefill_forward_cost_tokens))
            admitted = []
            if apart:
                logits = apart_logits if logits is None else torch.cat([logits, apart_logits])
                done += apart
            lap = self._lap("prefill", lap)
        if logits is not None or launched:
            rows = [*decoding, *done]
            if not launched and self.config.overlap_steps:
                single = self.launcher.sampling(rows, len(decoding), logits)
                launched = [single] if single is not None else []
            if launched:
                lap = self._lap("sample", lap)
                steps = self._accept_in_flight()
                self.in_flight = launched
            else:
                self._read_in_flight()  # first: the rows' sampling reads their tokens so far
                sampled = self._sample(rows, logits)
                lap = self._lap("sample", lap)
                steps = self._accept(decoding, logits[: len(decoding)], sampled[: len(decoding)])
                steps += self._accept(done, logits[len(decoding):], sampled[len(decoding):], prefill=True)
            self.running.extend(done)
            self._release_finished()  # before their final steps go out: a client that has one finds them free
            self._publish(steps)
            lap = self._lap("accept", lap)
        if self.in_flight and self.launcher.launches == launches_before:
            self._read_in_flight()  # nothing launched this iteration: the last step's tokens are all that is left
        # Without overlapped steps (the CPU, where a forward is done when its call returns) each group's first tokens
        # go out before the next group's forward: read all at the end, TTFT p50 at 8 streams was 0.29 -> 0.40 s.
        for group in prefill_groups(admitted, self.runner.prefill_forward_cost_tokens):
            self._prefill(group)
        self._release_finished()
        self.iteration += 1
        steps_run = greedy.steps if greedy else 1  # decode steps this iteration
        self._record_stats(decoded, joined, context_tokens, decoded * steps_run)
        self._lap("prefill", lap)
        self.step_budget.observe(decoded, context_tokens, (time.monotonic() - started) / steps_run)
        return True

    # -- overlapped steps ------------------------------------------------------------------------------------------
    def _may_overlap(self) -> bool:
        """Whether the next step may launch before the in-flight step's tokens are read: every running sequence's
        sampling can do without its last token on the host, and the pool grows each by one block if it must without
        preempting anyone (a preempted sequence's token on the device would be lost, and with it a seeded draw)."""
        block_size, needed = self.blocks.block_size, 0
        for sequence in self.running:  # one pass, plain arithmetic: every step asks it of every row
            if not sequence.overlappable:
                return False
            beyond = len(sequence.token_ids) + sequence.pending - len(sequence.blocks.block_ids) * block_size
            if beyond > 0:
                needed += -(-beyond // block_size)
        return needed <= self.blocks.free_blocks

    def _greedy_steps_ahead(self, decoding: list[Sequence], prompts: list[Sequence]) -> GreedySteps | None:
        """`decode_steps` steps to launch at once (`StepLauncher.greedy_steps`), each row's blocks grown for them now;
        None for one step. They run while the batch only decodes, nothing waits to join (a newcomer is not held back by
        steps launched ahead), every row is a plain argmax that may overlap (greedy, no log probs, nothing processed
        on the host; its end id banned on the device while short of min_tokens), and the pool holds the blocks
        without preempting anyone. A row that ends within them has the rest of its steps computed for nothing, as
        with one step ahead."""
        steps = self.config.decode_steps
        if (steps <= 1 or not self.config.overlap_steps or not decoding or prompts or self._incoming
                or self.scheduler.waiting or self.scheduler.prefilling):
            return None
        block_size, needed, limit = self.blocks.block_size, 0, self.runner.max_positions
        end_ids, bans = [], []
        for sequence in decoding:  # one pass, plain arithmetic: every iteration asks it of every row
            sampling = sequence.sampling
            tokens = len(sequence.token_ids) + sequence.pending  # what it has once its tokens so far are read
            if not sequence.overlappable or not sampling.greedy or sampling.log_probs or tokens + steps - 1 > limit:
                return None
            banned = sequence.end_id_banned_steps()  # its end id is banned in that many of the steps
            end_ids.append(sequence.end_id if banned else 0)
            bans.append(banned)
            beyond = tokens + steps - 1 - len(sequence.blocks.block_ids) * block_size  # the last step feeds that token
            if beyond > 0:
                needed += -(-beyond // block_size)
        if needed > self.blocks.free_blocks:
            return None
        if needed:
            for sequence in decoding:
                self.blocks.grow(sequence.blocks, len(sequence.token_ids) + sequence.pending + steps - 1)
        return GreedySteps(steps, end_ids, bans)

    def _accept_in_flight(self) -> list[Step]:
        """The in-flight steps' tokens, read (waiting for them if need be) and accepted, oldest first: one step per
        request. Rows that ended meanwhile (cancelled, or ended by the tokens read before) are skipped."""
        launched, self.in_flight = self.in_flight, []
        if len(launched) == 1:
            return self._accept_launched(launched[0])
        merged: dict[int, Step] = {}
        for step_in_flight in launched:
            for step in self._accept_launched(step_in_flight):
                if step.request_id in merged:
                    _merge_step(merged[step.request_id], step)
                else:
                    merged[step.request_id] = step
        return list(merged.values())

    def _accept_launched(self, launched: StepInFlight) -> list[Step]:
        """One launched step's tokens, read and accepted."""
        if launched.ready is not None:
            launched.ready.synchronize()
        tokens = launched.host_tokens.tolist()
        log_probs = launched.host_log_probs.tolist() if launched.host_log_probs is not None else None
        steps = []
        decoding = launched.decoding
        for row, sequence in enumerate(launched.rows):
            sequence.pending -= 1
            if sequence.status is FINISHED:
                continue
            sampled = (tokens[row], log_probs[row] if log_probs is not None and sequence.sampling.log_probs else None,
                       None)  # rows with top log probs are never overlapped (Sequence.may_overlap)
            prefill = row >= decoding
            try:
                steps.append(self._accept_row(sequence, None, sampled, prefill))
            except Exception as exc:  # noqa: BLE001 - this request's own failure
                steps.append(self._fail(sequence, "prefill" if prefill else "decode", exc))
        return steps

    def _read_in_flight(self) -> None:
        """Accept and publish the in-flight steps' tokens now (before a step whose sampling needs them)."""
        if self.in_flight:
            steps = self._accept_in_flight()
            self._release_finished()
            self._publish(steps)

    def _lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + now - since
        return now

    def _prefills_in_decode(
        self, admitted: list[Sequence], decoding: list[Sequence]
    ) -> tuple[list[Sequence], list[Sequence]]:
        """(prompts prefilled in the decode step's forward, prompts prefilled in forwards of their own). Where the
        runner mixes prompts into its decode forward (the CPU), the first forward's worth of them join
        (`prefill_groups`): the step reads the weights once. With CUDA graphs a prompt joins the decode step, one row
        a token, while the step has a graph bucket (`ModelRunner.takes_in_graph`): its prefill is then a graph replay
        instead of an eager forward (13-18 ms of the host's launches for SmolLM2 on an H200)."""
        if not admitted:
            return [], []
        if self.runner.mixes_prompts:
            groups = prefill_groups(admitted, self.runner.prefill_forward_cost_tokens)
            if groups[0][0].wants_prompt_logits:  # its forward is its own (prefill_groups puts those last)
                return [], admitted
            return groups[0], [sequence for group in groups[1:] for sequence in group]
        rows, width = len(decoding), max((len(sequence.blocks.block_ids) for sequence in decoding), default=0)
        joining, apart = [], []
        for sequence in admitted:
            with_it = rows + sequence.prefill_len, max(width, len(sequence.blocks.block_ids))
            if not apart and not sequence.wants_prompt_logits and self.runner.takes_in_graph(*with_it):
                joining.append(sequence)
                rows, width = with_it
            else:
                apart.append(sequence)
        return joining, apart

    def _decode(
        self, decoding: list[Sequence], joining: list[Sequence]
    ) -> tuple[torch.Tensor | None, list[Sequence]]:
        """(the decode step's logits, or None with nothing decoding; the prompts it prefilled). When the forward
        with `joining` fails, the decode runs again without them, and they are left to forwards of their own (so a
        failure of theirs stays theirs). A failed forward of the batch alone is nobody's in particular: it stops
        the engine (see _run)."""
        # The in-flight step's tokens, for the sequences fed from the device (only passed when there are some).
        fed = {"fed": self.in_flight[-1].tokens} if self.in_flight else {}
        if joining:
            try:
                return self.runner.decode(decoding, joining, **fed), joining
            except Exception as exc:  # noqa: BLE001 - see above
                log.warning("decode step with %d prompts failed (%s); they are prefilled apart", len(joining), exc)
        return (self.runner.decode(decoding, **fed) if decoding else None), []

    def _prompts_done(
        self, prefilled: list[Sequence], logits: torch.Tensor, decoding: int
    ) -> tuple[torch.Tensor, list[Sequence]]:
        """Mark the chunks computed; (the logits of the decoding rows and of the prompts now complete, those prompts).
        A prompt with chunks to go has no token to sample yet."""
        done = []
        for sequence in prefilled:
            self._computed(sequence, sequence.prefill_end)
            if sequence.num_computed == len(sequence.token_ids):
                self.scheduler.prefilled(sequence)
                done.append(sequence)
        if len(done) < len(prefilled):
            complete = [s.num_computed == len(s.token_ids) for s in prefilled]
            rows = [*range(decoding), *(decoding + i for i, ends in enumerate(complete) if ends)]
            logits = logits[to_device(rows, logits.device, torch.long)]
        return logits, done

    def _end_cancelled_and_expired(self, cancels: set[int], now: float) -> list[Step]:
        # Every sequence is looked at only when cancels came; else only those with a deadline (most iterations have
        # neither, and this ran over every row of every step), the ones that ended meanwhile dropped on the way.
        if cancels:
            candidates = [*self.scheduler.waiting, *self.scheduler.prefilling, *self.running]
        else:
            candidates = self._timed = [sequence for sequence in self._timed if sequence.status is not FINISHED]
        steps = []
        for sequence in candidates:
            if sequence.request_id in cancels:
                sequence.finish(FinishReason.CANCELLED)
            elif sequence.deadline is not None and now >= sequence.deadline:
                sequence.finish(FinishReason.TIMED_OUT)
            else:
                continue
            steps.append(sequence.step([]))
        for sequence in self.scheduler.remove_finished():
            self._release(sequence)
        if steps:
            self._release_finished()
        return steps

    def _prefill(self, group: list[Sequence]) -> None:
        """Prefill a group's chunks (steps without overlap): the first tokens of its complete prompts are sampled and
        sent at once."""
        done, logits = self._prompt_forwards([group])
        self.running.extend(done)
        if done:
            steps = self._accept(done, logits, self._sample(done, logits), prefill=True)
            self._release_finished()
            self._publish(steps)

    def _prompt_forwards(self, groups: list[list[Sequence]]) -> tuple[list[Sequence], torch.Tensor | None]:
        """The groups' chunks prefilled into their own new blocks: (the prompts now complete, the logits of their last
        tokens), None without any. Nothing waits for the device: every group's forward is queued back to back."""
        done, logits = [], []
        for group in groups:
            for prefilled, group_logits in self._prefill_forwards(group):
                group_logits, group_done = self._prompts_done(prefilled, group_logits, 0)
                if group_done:
                    done += group_done
                    logits.append(group_logits)
        if not done:
            return [], None
        return done, torch.cat(logits) if len(logits) > 1 else logits[0]

    def _prefill_forwards(self, group: list[Sequence]) -> list[tuple[list[Sequence], torch.Tensor]]:
        """[(prompts, their chunks' logits)]: the group's forward, or when it fails each prompt's own. A prompt whose
        own forward fails ends with an error step; it wrote nothing that any other request reads (its blocks are not
        findable before its prefill succeeds), so its blocks are just freed."""
        try:
            if group[0].wants_prompt_logits:  # alone in its group (prefill_groups)
                (sequence,) = group
                every_token = self.runner.prefill_logits(sequence)
                if sequence.num_computed == 0:  # its first chunk (again, if it was preempted while prefilling)
                    sequence.context_chunks = []
                sequence.context_chunks.append(every_token.cpu().numpy())
                return [(group, every_token[-1:])]
            return [(group, self.runner.prefill(group))]
        except Exception as exc:  # noqa: BLE001 - whose it was is found out below
            if len(group) == 1:
                step = self._fail(group[0], "prefill", exc)
                self.scheduler.prefilled(group[0])
                self._release(group[0])
                self._publish([step])
                return []
            log.warning("prefill of %d requests failed (%s); each is tried alone", len(group), exc)
            return [part for sequence in group for part in self._prefill_forwards([sequence])]

    def _computed(self, sequence: Sequence, tokens: int) -> None:
        """The keys and values of the sequence's first `tokens` tokens are written: its full blocks become shareable."""
        sequence.num_computed = tokens
        if (sequence.blocks.hashed_blocks + 1) * self.blocks.block_size <= tokens:  # else no block filled up
            self.blocks.register_full_blocks(sequence.blocks, sequence.token_ids, tokens)

    def _release(self, sequence: Sequence) -> None:
        if sequence.blocks is not None:
            self.blocks.free(sequence.blocks)
            sequence.blocks = None

    def _sample(self, sequences: list[Sequence], logits: torch.Tensor) -> list[tuple | None]:
        """(token, log prob, top log probs) per row; all None when the batch failed (each row is then sampled alone in _accept)."""
        try:
            return list(zip(*sample_next_tokens(logits, [s.sampling_state() for s in sequences])))
        except Exception as exc:  # noqa: BLE001 - sampled again row by row, so a failure is pinned on its own row
            log.warning("sampling %d rows failed (%s); each row is sampled alone", len(sequences), exc)
            return [None] * len(sequences)

    def _accept(
        self, sequences: list[Sequence], logits: torch.Tensor, sampled: list, prefill: bool = False
    ) -> list[Step]:
        steps = []
        for row, sequence in enumerate(sequences):
            if sequence.status is FINISHED:  # ended by the in-flight step's tokens, read before this step was sampled
                continue
            try:
                steps.append(self._accept_row(sequence, logits[row], sampled[row], prefill))
            except Exception as exc:  # noqa: BLE001 - this request's own failure
                steps.append(self._fail(sequence, "prefill" if prefill else "decode", exc))
        return steps

    def _accept_row(
        self, sequence: Sequence, logits: torch.Tensor | None, sampled: tuple | None, prefill: bool
    ) -> Step:
        if sampled is None:
            (token,), (log_prob,), (top,) = sample_next_tokens(logits[None], [sequence.sampling_state()])
        else:
            token, log_prob, top = sampled
        if token == NO_ALLOWED_TOKEN:
            sequence.finish(FinishReason.ERROR)
            step = sequence.step([])
            step.error = ("no token is allowed next: bad_words, embedding_bias and the guide (if any) together ban "
                          "every token")
            step.client_error = True
            return step
        # A prompt's first token, not a resumed sequence's prefill: its context logits go with it, if asked for.
        context_logits = prefill and sequence.want_context_logits and sequence.num_output == 0
        step = sequence.accept(token, log_prob, self.runner.max_positions)
        if top is not None and step.token_ids:
            step.top_log_probs = [top]
        # Logits only for requests that asked (NVIDIA's return_*_logits): the copies cost a vocabulary each.
        if sequence.want_generation_logits and step.token_ids:
            step.generation_logits = logits.float().cpu().numpy()[None, None]  # [beams, tokens, vocab]
        if context_logits:  # its prefill's chunks, each computed with every token's logits
            step.context_logits = np.concatenate(sequence.context_chunks)
            sequence.context_chunks = []
        return step

    def _fail(self, sequence: Sequence, stage: str, exc: Exception) -> Step:
        """End one request with an error step (its row, if any, is freed with the finished ones)."""
        log.error("request %s failed in %s: %s: %s", sequence.request_id, stage, type(exc).__name__, exc,
                  exc_info=exc)
        sequence.finish(FinishReason.ERROR)
        step = sequence.step([])
        step.error = f"{stage} failed: {type(exc).__name__}: {exc}"
        return step

    def _release_finished(self) -> None:
        finished = [sequence for sequence in self.running if sequence.status is FINISHED]
        if not finished:
            return
        for sequence in finished:
            self._release(sequence)
        self.running = [sequence for sequence in self.running if sequence.status is not FINISHED]

    def _record_stats(self, decoded: int, admitted: int, context_tokens: int, decode_tokens: int) -> None:
        """`decode_tokens`: the tokens the iteration's decode steps computed (one a decoding row a step)."""
        blocks = self.blocks
        looked_up = blocks.total_reused + blocks.total_missed
        reuse = blocks.enable_reuse
        gpu_bytes = 0  # NVIDIA's memory_type=gpu: what this engine holds there (nothing on a CPU engine)
        if self.runner.device.type == "cuda":
            # The nested form: memory_allocated() flattens every allocator statistic in Python, each iteration.
            gpu_bytes = torch.cuda.memory_stats_as_nested_dict(self.runner.device)["allocated_bytes"]["all"]["current"]
        stats = IterationStats(
            timestamp=time.time(),
            iteration=self.iteration,
            active_requests=len(self.running),
            queued_requests=len(self.scheduler.waiting),
            max_active_requests=self.config.max_batch_size,
            scheduled_requests=decoded + admitted,
            context_requests=admitted,
            generation_requests=decoded,
            context_tokens=context_tokens,
            tokens_in_step=decode_tokens + context_tokens,
            gpu_mem_bytes=gpu_bytes,
            cpu_mem_bytes=self._host_bytes,
            pinned_mem_bytes=0,  # nothing here is allocated in pinned host memory
            # NVIDIA's paused requests: preempted for KV blocks, back in the queue with tokens already sent.
            paused_requests=sum(1 for sequence in self.scheduler.waiting if sequence.num_output),
            micro_batch_id=0,  # no pipeline parallelism: one micro batch
            # used = blocks the admitted requests hold; free includes cached blocks nobody holds (they are evicted
            # when needed).
            kv_cache=KvCacheStats(
                max_blocks=blocks.num_blocks,
                free_blocks=blocks.free_blocks,
                used_blocks=blocks.num_blocks - blocks.free_blocks,
                tokens_per_block=blocks.block_size,
                reused_blocks=blocks.total_reused if reuse else None,
                missed_blocks=blocks.total_missed if reuse else None,
                cache_hit_rate=(blocks.total_reused / looked_up if looked_up else 0.0) if reuse else None,
            ),
        )
        with self._lock:
            self._stats.append(stats)


def host_memory_bytes(runner: ModelRunner) -> int:
    """Host memory the engine holds: the weights and the KV pool when they live on the CPU (NVIDIA's
    memory_type=cpu); on a GPU engine both are in GPU memory."""
    if runner.device.type != "cpu":
        return 0
    tensors = [*runner.model.parameters(), *runner.model.buffers()]
    weights = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    return weights + (runner.pool.nbytes() if runner.pool is not None else 0)


def _merge_step(pending: Step, step: Step) -> None:
    """Fold a request's newer step into its unread one: tokens, log probs and logits rows add up (logits along
    the token axis); what describes the request so far (finish, cumulative log prob, cache counts) is the newer."""
    pending.token_ids.extend(step.token_ids)
    if pending.log_probs is not None and step.log_probs is not None:
        pending.log_probs.extend(step.log_probs)
    if step.top_log_probs is not None:
        pending.top_log_probs = (pending.top_log_probs or []) + step.top_log_probs
    if step.generation_logits is not None:
        if pending.generation_logits is None:
            pending.generation_logits = step.generation_logits
        else:
            pending.generation_logits = np.concatenate([pending.generation_logits, step.generation_logits], axis=1)
    if pending.context_logits is None:
        pending.context_logits = step.context_logits
    pending.cum_log_prob = step.cum_log_prob
    pending.is_final, pending.finish_reason = step.is_final, step.finish_reason
    if not pending.error:
        pending.error, pending.client_error = step.error, step.client_error
    if step.kv_cache_alloc_total_blocks is not None:
        pending.kv_cache_alloc_new_blocks = step.kv_cache_alloc_new_blocks
        pending.kv_cache_reused_blocks = step.kv_cache_reused_blocks
        pending.kv_cache_alloc_total_blocks = step.kv_cache_alloc_total_blocks
