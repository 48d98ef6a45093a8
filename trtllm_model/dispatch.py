"""Dispatch: the worker threads that wait on the executor and deliver each request's responses.

`sender_threads` + 1 workers share two jobs. One at a time waits on the executor (await_steps, never spinning) and
posts each step to its request's mailbox; the others deliver ready requests. A free worker takes the executor before
any ready request, so new steps never wait for a backlog. The worker that posted steps releases the executor to an
idle worker and delivers the first ready request itself: a token reaches Triton without a thread hand-off, and the
executor is never waited on by a thread that is sending. A request is delivered by one worker at a time, everything
in its mailbox as one response (one IPC round trip instead of many), so its responses stay in order and coalesce
under load; requests still waiting for their first token are delivered first.

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

from .executor_interface import Executor, Step
from .request_context import ErrorCode, RequestContext, RequestState
from .responses import ErrorReply, Message, Reply, ResponseAssembler

log = logging.getLogger(__name__)


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
        self._ready: deque[RequestContext] = deque()
        self._polling = False
        self._threads = [threading.Thread(target=self._work_loop, name=f"worker-{i}", daemon=True) for i in range(workers)]

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
            # Requests still waiting for their first token go first, so that under load time to first token
            # does not grow with the number of streams.
            if ctx.first_token_ns:
                self._ready.append(ctx)
            else:
                self._ready.appendleft(ctx)

    # -- workers -----------------------------------------------------------------------------------------------
    def _work_loop(self) -> None:
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
                    if self._ready:
                        ctx = self._ready.popleft()
                        break
                    if not self.running:
                        return
                    self._work.wait()
            if ctx is None:
                ctx = self._poll_once()
            if ctx is not None:
                self._deliver_ready(ctx)

    def _poll_once(self) -> RequestContext | None:
        """Wait on the executor once (this worker holds the poll role) and post what it returns; returns the
        first ready request, which this worker delivers itself (no thread hand-off on the way to Triton)."""
        try:
            steps = self.executor.await_steps(self.await_timeout_s)
            dead = None if steps else self.executor.health_error()
        except Exception as exc:
            steps, dead = [], f"{type(exc).__name__}: {exc}"
        if dead is not None:
            self.polling_allowed = False  # first: no worker polls again
            self._executor_failed(dead)
        routed = self._route(steps) if steps else []
        with self._work:
            self._polling = False
            for ctx, step in routed:
                self._post(ctx, step)
            mine = self._ready.popleft() if routed and self._ready else None
            # Idle workers: one takes over the executor, the others take ready requests.
            if mine is not None:
                self._work.notify(len(self._ready) + 1)
        return mine

    def _deliver_ready(self, ctx: RequestContext) -> None:
        with self._work:
            work, ctx.mailbox = ctx.mailbox, []
        self.deliver(ctx, work)
        with self._work:
            if ctx.mailbox:  # more arrived while sending: back of the queue, delivered in a later turn
                self._ready.append(ctx)
            else:
                ctx.scheduled = False

    # -- delivery ---------------------------------------------------------------------------------------------
    def deliver(self, ctx: RequestContext, work: list) -> None:
        # Under the request's lock: the cancel watch must never ask Triton about a request whose final response
        # is being sent (tritonserver 2.51 segfaults in ResponseFactoryIsCancelled after the final).
        with ctx.lock:
            if ctx.state is RequestState.ENDED:
                return
            failed = self._send_locked(ctx, work)
            ended = ctx.state is RequestState.ENDED
        if ended:
            self._on_ended(ctx, failed)

    def _send_locked(self, ctx: RequestContext, work: list) -> bool:
        """Build and send; returns True when that failed (the request then ended early). Ends the request (ENDED)
        once a final response was sent or tried, whatever failed before it."""
        failure = next((w for w in work if isinstance(w, ErrorReply)), None)
        steps = [w for w in work if isinstance(w, Step)]
        final_tried = False
        try:
            for message in self.assembler.messages(ctx, steps, failure):
                final_tried = message.final
                if message.final:
                    self._on_final_ready(ctx)
                _send(ctx, message)
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


def _send(ctx: RequestContext, message: Message) -> None:
    if isinstance(message, Reply):
        ctx.stream.send(message.outputs, final=message.final)
    else:
        ctx.stream.send_error(message.code, message.message)


def _is_send_error(exc: Exception) -> bool:
    # Triton's stub raises TritonModelException when a response can no longer be sent.
    return type(exc).__name__ == "TritonModelException"
