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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .dispatch import Dispatcher
from .executor_interface import Executor, ExecutorError, QueueFull, RequestRejected, Step
from .request_context import ErrorCode, RequestContext, RequestState
from .responses import ErrorReply, ResponseAssembler
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
        on_finished: Callable[[RequestContext], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        unloading: Callable[[], bool] | None = None,
    ) -> None:
        self.executor = executor
        self.detokenizer_factory = detokenizer_factory
        self.max_open_requests = max_open_requests
        self.on_finished = on_finished
        self.on_failure = on_failure
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._open: dict[int, RequestContext] = {}
        # Triton request id -> the requests in flight under it (several for a batched request), for `stop`.
        self._by_triton_id: dict[str, list[RequestContext]] = {}
        # Enqueue runs outside `_lock` (an executor may take its time); steps for an id not registered yet wait here.
        self._enqueuing = 0
        self._early: dict[int, list[Step]] = {}
        self._accepting = True
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
            return len(self._open)

    # -- called from execute() ---------------------------------------------------------------------------------
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
        return refusal

    def _refusal(self) -> tuple[ErrorCode, str] | None:
        """Why a new request is refused now, or None (caller holds `_lock`)."""
        if self.failure is not None:
            return ErrorCode.UNAVAILABLE, f"model not ready: {self.failure}"
        if not self._accepting:
            return ErrorCode.UNAVAILABLE, "model is shutting down"
        held = len(self._open) + self._enqueuing
        if self.max_open_requests is not None and held >= self.max_open_requests:
            return ErrorCode.UNAVAILABLE, str(QueueFull(held, self.max_open_requests, "requests in flight"))
        return None

    def _stop_by_triton_id(self, ctx: RequestContext) -> None:
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
        """End every open stream with UNAVAILABLE, stop the executor and join every thread."""
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

    def _fail_all(self, code: ErrorCode, message: str) -> None:
        with self._lock:
            contexts = list(self._open.values())
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
        return routed

    def _ended(self, ctx: RequestContext, delivery_failed: bool) -> None:
        """A request's final response left (dispatch calls this once per request)."""
        if delivery_failed:
            self._cancel(ctx)
            with self._lock:
                self._unregister(ctx)

    def _final_ready(self, ctx: RequestContext) -> None:
        """A request's final response is about to be sent (dispatch calls this once per request): NVIDIA's metric
        checks read the request's histograms right after it, so the metrics record it now."""
        if self.on_finished is not None:
            try:
                self.on_finished(ctx)
            except Exception:
                log.exception("on_finished hook failed")

    def _unregister(self, ctx: RequestContext) -> None:
        """Forget `ctx` (caller holds `_lock`)."""
        if self._open.get(ctx.executor_id) is ctx:
            del self._open[ctx.executor_id]
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
            return [ctx for ctx in self._open.values() if not ctx.cancel_requested]

    def _cancel(self, ctx: RequestContext) -> None:
        if ctx.cancel_requested:
            return
        ctx.cancel_requested = True
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
