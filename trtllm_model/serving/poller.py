"""The poller: the registry of requests in flight, between `execute()`, the executor and the streams.

It hands each request to the executor, routes the executor's steps to their requests, and ends every request with
exactly one final response: its last tokens, an error, CANCELLED, or UNAVAILABLE when the executor dies or the model
shuts down. The threads are in dispatch.py (wait on the executor, deliver) and watches.py (cancellations, unload);
what a response carries is in responses.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from ..executor_interface import Executor, ExecutorError, FinishReason, QueueFull, RequestRejected, Step
from .dispatch import Dispatcher
from .request_context import ErrorCode, RequestContext, RequestState
from .responses import ErrorReply, ResponseAssembler
from .row_admission import BatchedRowGate
from .watches import StreamWatch

log = logging.getLogger(__name__)

# A guided request's enqueue waits for its guide to compile (the embedded engine: up to guide_compile_timeout_s), so
# guided requests are enqueued from these threads, never from execute(): a slow guide delays only guided requests.
ADMISSION_THREADS = 4


class Poller:
    def __init__(
        self,
        executor: Executor,
        detokenizer_factory: Callable[[], object] | None = None,
        sender_threads: int = 2,
        await_timeout_s: float = 0.1,
        cancel_check_s: float = 0.1,
        max_open_requests: int | None = None,
        max_batched_rows: int | None = None,
        on_finished: Callable[[RequestContext], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        unloading: Callable[[], bool] | None = None,
        on_unload: Callable[[], None] | None = None,
        stop_by_request_id: bool = True,
    ) -> None:
        self.executor = executor
        self.detokenizer_factory = detokenizer_factory
        self.max_open_requests = max_open_requests
        self.on_finished = on_finished
        self.on_failure = on_failure
        self.on_unload = on_unload
        # NVIDIA's `stop` input ends the requests in flight under its request id, whoever sends it: Triton tells the
        # model nothing about the caller (no connection, peer or stream), so any client that knows or guesses an id
        # can end another's stream. False refuses every `stop` (docs/security.md); clients cancel their own request.
        self.stop_by_request_id = stop_by_request_id
        self.failure: str | None = None
        self._shutdown_lock = threading.Lock()
        self._shut_down = False
        self._lock = threading.Lock()
        self._open: dict[int, RequestContext] = {}
        # Triton request id -> the requests in flight under it (several for a batched request), for `stop`.
        self._by_triton_id: dict[str, list[RequestContext]] = {}
        # Enqueue runs outside `_lock` (an executor may take its time); steps for an id not registered yet wait here.
        self._enqueuing = 0
        self._early: dict[int, list[Step]] = {}
        self._accepting = True
        # Rows of batched requests wait here for a bounded share of the batch slots (row_admission.py).
        self._rows = BatchedRowGate(max_batched_rows)
        self._admission = ThreadPoolExecutor(ADMISSION_THREADS, thread_name_prefix="guided-admission")
        self.dispatcher = Dispatcher(
            executor,
            ResponseAssembler(detokenizer_factory),
            route=self._route,
            executor_failed=self._executor_failed,
            on_ended=self._ended,
            on_final_ready=self._final_ready,
            workers=max(1, sender_threads) + 1,
            await_timeout_s=await_timeout_s,
        )
        self.watch = StreamWatch(
            "cancel-watch",
            cancel_check_s,
            open_items=self._open_snapshot,
            is_cancelled=_client_cancelled,
            on_cancelled=self._cancel,
            unloading=unloading,
            on_unload=self._unloading_seen,
        )

    def start(self) -> None:
        self.dispatcher.start()
        self.watch.start()

    @property
    def accepting(self) -> bool:
        """Whether new requests are taken: readiness follows this (False after a failure, an unload or shutdown)."""
        return self._accepting and self.failure is None

    @property
    def open_requests(self) -> int:
        with self._lock:
            return len(self._open) + self._rows.held

    # -- called from execute() ---------------------------------------------------------------------------------
    @contextmanager
    def executing(self, requests: int) -> Iterator[None]:
        """Around execute()'s batch of `requests`: their enqueues reach the executor together when it ends
        (`Executor.enqueue_together`), and it is timed with the delivery phases when TRTLLM_DELIVERY_TIMING_S is set
        (its wall against its thread's CPU shows how long it waited for the interpreter's lock)."""
        with self.dispatcher.timing.executing(requests), self.executor.enqueue_together():
            yield

    def submit_rows(self, rows: list[RequestContext]) -> None:
        """Hand a request's rows to the executor; a batched request's rows go through the row gate, all accepted or
        all refused. A `stop` row stops by id at once; it never lets the request's other rows past the gate."""
        for ctx in rows:
            if ctx.parsed.stop_only:
                self.submit(ctx)
        rows = [ctx for ctx in rows if not ctx.parsed.stop_only]
        if len(rows) <= 1 or self._rows.limit is None:
            for ctx in rows:
                self.submit(ctx)
            return
        for ctx in rows:
            if ctx.parsed.text_mode and self.detokenizer_factory is not None:
                ctx.detokenizer = self.detokenizer_factory()
        with self._lock:
            refusal = self._refusal(len(rows)) or self._batched_refusal(len(rows))
            if refusal is None:
                self._rows.add(rows)
                ready = self._take_ready_rows()
        if refusal is not None:
            for ctx in rows:
                self._refuse(ctx, *refusal)
            return
        self._start_rows(ready)

    def submit(self, ctx: RequestContext) -> None:
        """Hand a parsed request to the executor; any refusal is answered on its stream right away."""
        if ctx.parsed.stop_only:
            self._stop_by_triton_id(ctx)
            return
        if ctx.parsed.text_mode and self.detokenizer_factory is not None:
            ctx.detokenizer = self.detokenizer_factory()
        with self._lock:
            refusal = self._refusal()
            if refusal is None:
                self._enqueuing += 1
        if refusal is not None:
            self._refuse(ctx, *refusal)
            return
        if ctx.parsed.generation.guided_decoding_type is not None:
            try:
                self._admission.submit(self._admit, ctx)
                return
            except RuntimeError:  # shut down meanwhile: admitted here, and refused as not accepting
                pass
        self._admit(ctx)

    def _admit(self, ctx: RequestContext) -> None:
        """Enqueue a request (a guided one on an admission thread); a refusal is answered on its stream."""
        refusal = self._enqueue(ctx)
        if refusal is not None:
            self._refuse(ctx, *refusal)
            if ctx.holds_row_slot:
                with self._lock:
                    self._rows.ended(ctx)
                self._release_rows()

    # -- rows of batched requests (row_admission.py) -----------------------------------------------------------
    def _take_ready_rows(self) -> list[RequestContext]:
        """Rows the gate lets through now, counted as enqueuing (caller holds `_lock`)."""
        ready = self._rows.take_ready()
        self._enqueuing += len(ready)
        return ready

    def _start_rows(self, rows: list[RequestContext]) -> None:
        for ctx in rows:
            try:  # off the caller's thread: rows are released from the dispatcher's, which must keep delivering
                self._admission.submit(self._admit, ctx)
            except RuntimeError:  # shut down meanwhile: refused as not accepting
                self._admit(ctx)

    def _release_rows(self) -> None:
        """Start the rows a freed slot lets through."""
        if not self._rows.held:
            return
        with self._lock:
            ready = self._take_ready_rows()
        self._start_rows(ready)

    def _end_held_rows(self, rows: list[RequestContext], stopped: bool) -> None:
        """End rows that never reached the executor as a cancelled request ends (their request was cancelled)."""
        now = time.monotonic_ns()
        for ctx in rows:
            ctx.stopped, ctx.cancel_requested, ctx.enqueued_ns = stopped, True, now
        self.dispatcher.post([(ctx, Step(ctx.executor_id, is_final=True, finish_reason=FinishReason.CANCELLED))
                              for ctx in rows])

    def _enqueue(self, ctx: RequestContext) -> tuple[ErrorCode, str] | None:
        refusal = None
        try:
            ctx.executor_id = self.executor.enqueue(ctx.parsed.generation)
        except QueueFull as exc:
            refusal = (ErrorCode.UNAVAILABLE, str(exc))
        except RequestRejected as exc:
            refusal = (ErrorCode.UNSUPPORTED if exc.unsupported else ErrorCode.INVALID_ARG, str(exc))
        except ExecutorError as exc:
            refusal = (ErrorCode.UNAVAILABLE, f"executor unavailable: {exc}")
        except Exception as exc:  # an engine bug must not escape execute() and kill the batch
            log.exception("enqueue failed")
            refusal = (ErrorCode.INTERNAL, f"enqueue failed: {exc}")
        with self._lock:
            self._enqueuing -= 1
            early = self._early.pop(ctx.executor_id, []) if refusal is None else []
            if not self._enqueuing:
                self._early.clear()  # steps of ids nobody registers: requests that already ended
            if refusal is None and not self.accepting:  # a failure, shutdown or unload began meanwhile
                refusal = (ErrorCode.UNAVAILABLE, f"model not ready: {self.failure or 'shutting down'}")
                self._cancel_in_executor(ctx)
            if refusal is None:
                ctx.enqueued_ns = time.monotonic_ns()
                ctx.state = RequestState.RUNNING
                self._open[ctx.executor_id] = ctx
                if ctx.triton_request_id:
                    self._by_triton_id.setdefault(ctx.triton_request_id, []).append(ctx)
                if early and early[-1].is_final:
                    self._unregister(ctx)
        if refusal is None:
            self.watch.notify()
            if early:
                self.dispatcher.post([(ctx, step) for step in early])
                self._release_rows()
        return refusal

    def _refusal(self, rows: int = 1) -> tuple[ErrorCode, str] | None:
        """Why `rows` new requests are refused now, or None (caller holds `_lock`)."""
        if self.failure is not None:
            return ErrorCode.UNAVAILABLE, f"model not ready: {self.failure}"
        if not self._accepting:
            return ErrorCode.UNAVAILABLE, "model is shutting down"
        held = len(self._open) + self._enqueuing + self._rows.held
        if self.max_open_requests is not None and held + rows > self.max_open_requests:
            return ErrorCode.UNAVAILABLE, str(QueueFull(held, self.max_open_requests, "requests in flight"))
        return None

    def _batched_refusal(self, rows: int) -> tuple[ErrorCode, str] | None:
        """Rows of batched requests may hold at most half the request bound (caller holds `_lock`): the other half
        stays for one-row requests, whatever batched clients send (or cancel and send again). A batched request
        alone is never refused by this rule."""
        held = self._rows.in_flight + self._rows.held
        bound = None if self.max_open_requests is None else self.max_open_requests // 2
        if bound is not None and held and held + rows > bound:
            return ErrorCode.UNAVAILABLE, str(QueueFull(held, bound, "rows of batched requests in flight (half the "
                                                                     "request bound; one-row requests keep the rest)"))
        return None

    def _stop_by_triton_id(self, ctx: RequestContext) -> None:
        if not self.stop_by_request_id:
            self._refuse(ctx, ErrorCode.UNSUPPORTED, "stop: ending a request by its id is turned off on this server "
                         "(stop_by_request_id=false: the id does not show who sent it); cancel the request itself "
                         "(close its stream, or cancel its call)")
            return
        if not ctx.triton_request_id:
            self._refuse(ctx, ErrorCode.INVALID_ARG, "stop: needs the request id of the request to cancel")
            return
        with self._lock:
            targets = list(self._by_triton_id.get(ctx.triton_request_id, ()))
        # An id no longer in flight (the request just ended) is no error, as in NVIDIA's model: a client that
        # stops after a delay must not fail because generation was quicker.
        for target in targets:
            target.stopped = True
            self._cancel(target)
        try:
            if ctx.parsed.stop_error is not None:  # NVIDIA's LLM API model answers a stop with CANCELLED
                ctx.stream.send_error(ErrorCode.CANCELLED, ctx.parsed.stop_error)
            else:
                ctx.stream.send({}, final=True)  # an empty response, as NVIDIA's: every client sees its end
        except Exception:
            log.warning("could not answer a stop request", exc_info=True)
        ctx.state = RequestState.ENDED

    # -- shutdown and failure ----------------------------------------------------------------------------------
    def shutdown(self, reason: str = "model is shutting down", timeout_s: float = 10.0) -> None:
        """End every open stream with UNAVAILABLE, stop the executor and join every thread. Once only: a second call
        waits for the first to end."""
        with self._shutdown_lock:
            if self._shut_down:
                return
            with self._lock:
                self._accepting = False
            self._fail_all(ErrorCode.UNAVAILABLE, reason)
            self.watch.stop()
            # Not waited for: a guide still compiling ends in a refusal (no longer accepting) when its enqueue returns.
            self._admission.shutdown(wait=False)
            try:
                self.executor.shutdown()
            except Exception:
                log.exception("executor shutdown failed")
            self.dispatcher.stop(timeout_s)  # workers deliver what is ready (the failures above), then exit
            self._shut_down = True

    def _fail_all(self, code: ErrorCode, message: str) -> None:
        with self._lock:
            contexts = list(self._open.values()) + self._rows.take_all_held()
            self._open.clear()
            self._by_triton_id.clear()
        self.dispatcher.post([(ctx, ErrorReply(code, message)) for ctx in contexts])

    def _executor_failed(self, reason: str) -> None:
        log.error("executor failed: %s", reason)
        self.failure = reason
        self._fail_all(ErrorCode.UNAVAILABLE, f"executor failed: {reason}")
        if self.on_failure is not None:
            try:
                self.on_failure(reason)
            except Exception:
                log.exception("on_failure hook failed")

    def _unloading_seen(self) -> None:
        # Triton unloads a decoupled model only after every open request got its final response, and calls
        # finalize() after that: a shutdown with streams open would wait forever. So once the unload is confirmed,
        # end them first (and take nothing new).
        with self._lock:
            first = self._accepting
            self._accepting = False
        if first:
            log.warning("model is being unloaded: ending %d open streams", self.open_requests)
        self._fail_all(ErrorCode.UNAVAILABLE, "model is shutting down")
        if first and self.on_unload is not None:
            try:
                self.on_unload()
            except Exception:
                log.exception("on_unload hook failed")

    # -- routing (dispatch calls these) ------------------------------------------------------------------------
    def _route(self, steps: list[Step]) -> list[tuple[RequestContext, Step]]:
        with self._lock:
            routed = []
            for step in steps:
                ctx = self._open.get(step.request_id)
                if ctx is None:
                    if self._enqueuing:  # possibly a request whose enqueue has not returned yet
                        self._early.setdefault(step.request_id, []).append(step)
                    continue  # else already ended (failed send, shutdown): the executor's late steps are dropped
                if step.is_final:
                    self._unregister(ctx)
                routed.append((ctx, step))
        self._release_rows()
        return routed

    def _ended(self, ctx: RequestContext, delivery_failed: bool) -> None:
        """A request's final response left (dispatch calls this once per request)."""
        if delivery_failed:
            self._cancel(ctx)
            with self._lock:
                self._unregister(ctx)
            self._release_rows()

    def _final_ready(self, ctx: RequestContext) -> None:
        """A request's final response is about to be sent (dispatch calls this once per request): NVIDIA's metric
        checks read the request's histograms right after it, so the metrics record it now."""
        if self.on_finished is not None:
            try:
                self.on_finished(ctx)
            except Exception:
                log.exception("on_finished hook failed")

    def _unregister(self, ctx: RequestContext) -> None:
        """Forget `ctx` (caller holds `_lock`; then `_release_rows` once it is released)."""
        if self._open.get(ctx.executor_id) is ctx:
            del self._open[ctx.executor_id]
            self._rows.ended(ctx)
        siblings = self._by_triton_id.get(ctx.triton_request_id)
        if siblings is not None and ctx in siblings:
            siblings.remove(ctx)
            if not siblings:
                del self._by_triton_id[ctx.triton_request_id]

    def _refuse(self, ctx: RequestContext, code: ErrorCode, message: str) -> None:
        with ctx.lock:
            try:
                ctx.stream.send_error(code, message)
            except Exception:
                log.warning("could not send a refusal", exc_info=True)
            ctx.state = RequestState.ENDED

    # -- cancellation ------------------------------------------------------------------------------------------
    def _open_snapshot(self) -> list[RequestContext]:
        with self._lock:
            return [ctx for ctx in (*self._open.values(), *self._rows.waiting_groups()) if not ctx.cancel_requested]

    def _cancel(self, ctx: RequestContext) -> None:
        if ctx.cancel_requested:
            return
        ctx.cancel_requested = True
        if ctx.row_group is not None:  # its request's rows still waiting for a slot end now, never enqueued
            with self._lock:
                held = self._rows.take_held(ctx.row_group)
            self._end_held_rows(held, ctx.stopped)
            if ctx in held:
                return
        self._cancel_in_executor(ctx)

    def _cancel_in_executor(self, ctx: RequestContext) -> None:
        try:
            self.executor.cancel(ctx.executor_id)
        except Exception:
            log.exception("executor cancel failed for %s", ctx.executor_id)


def _client_cancelled(ctx: RequestContext) -> bool | None:
    with ctx.lock:  # see Dispatcher.deliver: never while (or after) its final response is sent
        if ctx.state is RequestState.ENDED:
            return None
        return ctx.stream.is_cancelled()
