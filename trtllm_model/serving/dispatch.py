"""Dispatch: the worker threads that wait on the executor and deliver each request's responses.

`sender_threads` + 1 workers share two jobs. One at a time waits on the executor (await_steps, never spinning) and
posts each step to its request's mailbox; the others deliver ready requests. A free worker takes the executor before
any ready request, so new steps never wait for a backlog. The worker that posted steps releases the executor to an
idle worker and delivers the first ready request itself: a token reaches Triton without a thread hand-off, and the
executor is never waited on by a thread that is sending. A request is delivered by one worker at a time, everything
in its mailbox as one response (one IPC round trip instead of many), so its responses stay in order and coalesce
under load.

Order, when sends cannot keep up with tokens: two queues, requests waiting for their first response and running
requests, each first in first out; a running request that got a response and has more waiting goes to the back of
its queue (round-robin: every running stream gets a response before any gets a second one). The two queues take
turns (at most `FIRSTS_PER_RUNNING` first responses, then one running request), so neither a new request's first
token nor a running stream waits unboundedly: a running stream waits at most about (1 + FIRSTS_PER_RUNNING) sends per
running stream ahead of it. Coalescing is then even: each stream's tokens gather for one round.

Delivery guarantees the final response: whatever fails while the responses are built or sent, a request whose
final response has not left gets one (an error), and only then is it ENDED. Right before a request's final response
is sent, `on_final_ready` runs once (the metrics record the request then, so a scrape that follows the final
response finds it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from ..executor_interface import Executor, Step
from .delivery_timing import DeliveryTiming, PhaseTimes
from .request_context import ErrorCode, RequestContext, RequestState
from .responses import ErrorReply, Message, Reply, ResponseAssembler

log = logging.getLogger(__name__)

# First responses sent in a row while running requests wait; then a running request gets its turn.
FIRSTS_PER_RUNNING = 1


class Dispatcher:
    def __init__(
        self,
        executor: Executor,
        assembler: ResponseAssembler,
        route: Callable[[list[Step]], list[tuple[RequestContext, Step]]],
        executor_failed: Callable[[str], None],
        on_ended: Callable[[RequestContext, bool], None],
        workers: int,
        await_timeout_s: float,
        on_final_ready: Callable[[RequestContext], None] = lambda ctx: None,
    ) -> None:
        self.executor = executor
        self.assembler = assembler
        self._route = route
        self._executor_failed = executor_failed
        self._on_ended = on_ended  # (ctx, delivery_failed): after the final response left
        self._on_final_ready = on_final_ready  # ctx: its final response is built and about to be sent
        self.await_timeout_s = await_timeout_s
        self.running = True
        self.polling_allowed = True  # False once the executor failed: nobody waits on it again
        self._work = threading.Condition(threading.Lock())
        self._first: deque[RequestContext] = deque()  # ready, no response sent yet
        self._running: deque[RequestContext] = deque()  # ready, responded before: round-robin
        self._firsts_in_a_row = 0
        self._polling = False
        self.timing = DeliveryTiming()
        self._threads = [
            threading.Thread(target=self._work_loop, args=(self.timing.for_worker(),), name=f"worker-{i}", daemon=True)
            for i in range(workers)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, deadline_s: float) -> None:
        """Deliver what is ready (the failures of a shutdown), then end every worker."""
        self.running = False
        with self._work:
            self._work.notify_all()
        deadline = time.monotonic() + deadline_s
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        if self.timing.period_s > 0:
            self.timing.log_breakdown()

    def post(self, items: list[tuple[RequestContext, Step | ErrorReply]]) -> None:
        with self._work:
            for ctx, item in items:
                self._post(ctx, item)
            self._work.notify_all()

    def _post(self, ctx: RequestContext, item: Step | ErrorReply) -> None:
        """Put one step or failure in a request's mailbox and queue the request (caller holds `_work`)."""
        ctx.mailbox.append(item)
        if not ctx.scheduled:
            ctx.scheduled = True
            self._queue(ctx)

    def _queue(self, ctx: RequestContext) -> None:
        """At the back of its queue (caller holds `_work`)."""
        (self._running if ctx.responded else self._first).append(ctx)

    def _next_ready(self) -> RequestContext | None:
        """The request to deliver next, taking turns between the two queues (caller holds `_work`)."""
        if self._first and (not self._running or self._firsts_in_a_row < FIRSTS_PER_RUNNING):
            self._firsts_in_a_row += 1
            return self._first.popleft()
        self._firsts_in_a_row = 0
        return self._running.popleft() if self._running else None

    def ready_count(self) -> int:
        return len(self._first) + len(self._running)

    # -- workers -----------------------------------------------------------------------------------------------
    def _work_loop(self, times: PhaseTimes) -> None:
        while True:
            with self._work:
                while True:
                    # The poll role comes first: were it taken only when no request is ready, a backlog of ready
                    # requests would keep every worker sending and new steps, first tokens included, would wait a
                    # whole delivery round (seen on the H200 host: 290 ms at 1024 streams, time to first token
                    # equal to the gap between a stream's responses).
                    if not self._polling and self.running and self.polling_allowed:
                        self._polling = True
                        ctx = None
                        break
                    ctx = self._next_ready()
                    if ctx is not None:
                        break
                    if not self.running:
                        return
                    self._work.wait()
            if ctx is None:
                ctx = self._poll_once(times)
            if ctx is not None:
                self._deliver_ready(ctx, times)
                self.timing.maybe_log()

    def _poll_once(self, times: PhaseTimes) -> RequestContext | None:
        """Wait on the executor once (this worker holds the poll role) and post what it returns; returns the
        first ready request, which this worker delivers itself (no thread hand-off on the way to Triton)."""
        started = time.perf_counter_ns()
        try:
            steps = self.executor.await_steps(self.await_timeout_s)
            dead = None if steps else self.executor.health_error()
        except Exception as exc:
            steps, dead = [], f"{type(exc).__name__}: {exc}"
        if dead is not None:
            self.polling_allowed = False  # first: no worker polls again
            self._executor_failed(dead)
        routed = []
        if steps:
            times.polls += 1
            routed = self._route(steps)
            started = times.add("route", times.add("receive", started))
        with self._work:
            self._polling = False
            for ctx, step in routed:
                self._post(ctx, step)
            mine = self._next_ready() if routed else None
            # Idle workers: one takes over the executor, the others take ready requests.
            if mine is not None:
                self._work.notify(self.ready_count() + 1)
        return mine

    def _deliver_ready(self, ctx: RequestContext, times: PhaseTimes) -> None:
        started = time.perf_counter_ns()
        with self._work:
            work, ctx.mailbox = ctx.mailbox, []
        times.add("queue_lock", started)
        self.deliver(ctx, work, times)
        started = time.perf_counter_ns()
        with self._work:
            if ctx.mailbox:  # more arrived while sending: back of its queue, delivered in its next turn
                self._queue(ctx)
            else:
                ctx.scheduled = False
        times.add("queue_lock", started)

    # -- delivery ---------------------------------------------------------------------------------------------
    def deliver(self, ctx: RequestContext, work: list, times: PhaseTimes | None = None) -> None:
        times = times or PhaseTimes()
        # Under the request's lock: the cancel watch must never ask Triton about a request whose final response
        # is being sent (tritonserver 2.51 segfaults in ResponseFactoryIsCancelled after the final).
        started = time.perf_counter_ns()
        with ctx.lock:
            times.add("request_lock", started)
            if ctx.state is RequestState.ENDED:
                return
            failed = self._send_locked(ctx, work, times)
            ended = ctx.state is RequestState.ENDED
        if ended:
            self._on_ended(ctx, failed)

    def _send_locked(self, ctx: RequestContext, work: list, times: PhaseTimes) -> bool:
        """Build and send; returns True when that failed (the request then ended early). Ends the request (ENDED)
        once a final response was sent or tried, whatever failed before it."""
        failure = next((w for w in work if isinstance(w, ErrorReply)), None)
        steps = [w for w in work if isinstance(w, Step)]
        final_tried = False
        try:
            for message in self.assembler.messages(ctx, steps, failure, times):
                final_tried = message.final
                if message.final:
                    started = time.perf_counter_ns()
                    self._on_final_ready(ctx)
                    times.add("metrics", started)
                _send(ctx, message, times)
                ctx.responded = True
            return False
        except Exception as exc:
            gone = _is_send_error(exc)
            # A failed send (client gone) or a bug while building the response: end only this request.
            log.warning("delivery failed for request %s: %s", ctx.executor_id, exc, exc_info=not gone)
            if not final_tried:
                ctx.finish_reason = "cancelled" if gone else "error"
                final_tried = True
                self._on_final_ready(ctx)
                try:
                    _send(ctx, ErrorReply(ErrorCode.INTERNAL, f"response failed: {type(exc).__name__}: {exc}"))
                except Exception:  # the stream is gone: nobody is left to tell
                    log.debug("could not send the final error", exc_info=True)
            return True
        finally:
            if final_tried:
                ctx.state = RequestState.ENDED


def _send(ctx: RequestContext, message: Message, times: PhaseTimes | None = None) -> None:
    started = time.perf_counter_ns()
    if isinstance(message, Reply):
        built = ctx.stream.send(message.outputs, final=message.final)
    else:
        built = ctx.stream.send_error(message.code, message.message)
    if times is not None:
        times.add("send", started)
        times.responses += 1
        if isinstance(built, tuple):  # TritonStream: (ns building its tensor objects, tensors): not the send's
            times.ns["send"] -= built[0]
            times.ns["triton_tensors"] += built[0]
            times.outputs += built[1]


def _is_send_error(exc: Exception) -> bool:
    # Triton's stub raises TritonModelException when a response can no longer be sent.
    return type(exc).__name__ == "TritonModelException"
