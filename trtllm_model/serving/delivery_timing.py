"""Where a response's time goes on the delivery path: cumulative seconds per phase.

Each poller worker owns one `PhaseTimes` (no lock, no shared counter between threads); `DeliveryTiming` sums them.
With `TRTLLM_DELIVERY_TIMING_S=N` in the server's environment the phases are timed and the dispatcher logs the
breakdown every N seconds (and once at shutdown) to the server log: microseconds per response in each phase over the
last period, and the `execute()` calls of that period (calls, requests a call, wall and thread CPU milliseconds a
call: wall well over CPU is waiting, for the interpreter's lock or Triton). Without it only the counts are kept:
timing every phase always cost the stub's saturated interpreter about a third of its responses (256 streams, poller
alone, 2-core machine: 15k instead of 25k responses/s).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

TIMING_ENV = "TRTLLM_DELIVERY_TIMING_S"
# receive: the executor's await_steps (waiting included) when it returned steps; route: steps to their requests;
# queue_lock / request_lock: waiting for the dispatcher's lock / a request's lock (the cancel watch holds it while it
# asks Triton); detokenize; tensors: the response's arrays; triton_tensors: Triton's tensor objects (BYTES
# serialization included); metrics: the final response's metrics hook; send: the response sender's send.
PHASES = ("receive", "route", "queue_lock", "request_lock", "detokenize", "tensors", "triton_tensors", "metrics",
          "send")
EXECUTE_KEYS = ("execute_calls", "execute_requests", "execute_ns", "execute_cpu_ns")

log = logging.getLogger("trtllm_model.serving.delivery_timing")


class PhaseTimes:
    """One worker's cumulative nanoseconds per phase, plus what they were spent on."""

    __slots__ = ("ns", "responses", "tokens", "outputs", "polls")

    def __init__(self) -> None:
        self.ns = dict.fromkeys(PHASES, 0)
        self.responses = 0
        self.tokens = 0
        self.outputs = 0  # output tensors sent (where the stream tells)
        self.polls = 0

    def add(self, phase: str, since_ns: int) -> int:
        """Count the time from `since_ns` (time.perf_counter_ns) to now in `phase`; returns now."""
        now = time.perf_counter_ns()
        self.ns[phase] += now - since_ns
        return now


class UntimedPhases(PhaseTimes):
    """Counts only (timing is off)."""

    __slots__ = ()

    def add(self, phase: str, since_ns: int) -> int:
        return since_ns


class DeliveryTiming:
    def __init__(self, period_s: float | None = None) -> None:
        self._workers: list[PhaseTimes] = []
        if period_s is None:
            period_s = _period_from_env()
        self.period_s = period_s
        # execute() calls (from the stub's main thread only): calls, requests, wall ns, thread CPU ns
        self._execute = [0, 0, 0, 0]
        self._last: tuple[float, dict[str, float]] = (time.monotonic(), self.totals())
        self._next_log = time.monotonic() + period_s if period_s > 0 else float("inf")
        if period_s > 0 and not log.handlers:  # the stub configures no logging: INFO would go nowhere
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
            log.propagate = False

    def for_worker(self) -> PhaseTimes:
        times = PhaseTimes() if self.period_s > 0 else UntimedPhases()
        self._workers.append(times)
        return times

    @contextmanager
    def executing(self, requests: int) -> Iterator[None]:
        """Around one execute() call of `requests` requests (timed only when the timers are on)."""
        if self.period_s <= 0:
            yield
            return
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            yield
        finally:
            wall, cpu = time.perf_counter_ns() - wall, time.thread_time_ns() - cpu
            for i, value in enumerate((1, requests, wall, cpu)):
                self._execute[i] += value

    def totals(self) -> dict[str, float]:
        """Seconds per phase and the counts, summed over the workers (a read racing a worker may be a step old)."""
        out: dict[str, float] = {phase: 0.0 for phase in PHASES}
        out.update(responses=0, tokens=0, outputs=0, polls=0)
        out.update(zip(EXECUTE_KEYS, self._execute, strict=True))
        for times in list(self._workers):
            for phase, ns in times.ns.items():
                out[phase] += ns / 1e9
            out["responses"] += times.responses
            out["tokens"] += times.tokens
            out["outputs"] += times.outputs
            out["polls"] += times.polls
        return out

    def maybe_log(self) -> None:
        """Log the last period's breakdown when one is due (the workers call this after each delivery)."""
        if time.monotonic() >= self._next_log:
            self._next_log = time.monotonic() + self.period_s
            self.log_breakdown()

    def log_breakdown(self) -> None:
        now, totals = time.monotonic(), self.totals()
        started, before = self._last
        self._last = (now, totals)
        log.info("%s", breakdown_line({k: totals[k] - before[k] for k in totals}, now - started))


def breakdown_line(delta: dict[str, float], seconds: float) -> str:
    """One log line: responses/s, tokens per response, then microseconds per response in each phase."""
    responses = max(1, int(delta["responses"]))
    phases = " ".join(f"{phase}={delta[phase] / responses * 1e6:.1f}" for phase in PHASES)
    calls = max(1, int(delta.get("execute_calls", 0)))
    executes = (f"; execute: {delta.get('execute_calls', 0) / max(seconds, 1e-9):.1f} calls/s, "
                f"{delta.get('execute_requests', 0) / calls:.1f} requests a call, "
                f"{delta.get('execute_ns', 0) / calls / 1e6:.2f} ms a call (thread CPU "
                f"{delta.get('execute_cpu_ns', 0) / calls / 1e6:.2f} ms)")
    return (f"delivery timing over {seconds:.1f} s: {delta['responses'] / max(seconds, 1e-9):.0f} responses/s, "
            f"{delta['tokens'] / responses:.2f} tokens/response, {delta['outputs'] / responses:.2f} outputs/response, "
            f"{delta['polls']:.0f} polls; us per response: {phases}{executes}")


def _period_from_env() -> float:
    try:
        return max(0.0, float(os.environ.get(TIMING_ENV, "0") or 0))
    except ValueError:
        return 0.0
