"""The poller: moves requests into the executor and tokens out to their streams, and never loses a request.

Threads (all started here, all stopped by `shutdown`):
  worker-N  `sender_threads` + 1 workers share two jobs. One at a time waits on the executor (await_steps,
            never spinning) and posts each step to its request's mailbox; the others deliver ready requests.
            A free worker takes the executor before any ready request, so new steps never wait for a backlog.
            The worker that posted steps releases the executor to an idle worker and delivers the first ready
            request itself: a token reaches Triton without a thread hand-off, and the executor is never
            waited on by a thread that is sending. A request is delivered by one worker at a time, everything
            in its mailbox as one response (one IPC round trip instead of many), so its responses stay in order
            and coalesce under load; requests still waiting for their first token are delivered first.
  cancel    every `cancel_check_s`, asks each open stream once whether its client cancelled, in one pass

Every accepted request ends with exactly one final response: its last tokens, an error, CANCELLED, or
UNAVAILABLE when the executor dies or the model shuts down.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .conversion import ResponseContent, response_outputs
from .executor_interface import Executor, ExecutorError, FinishReason, RequestRejected, Step
from .request_context import ErrorCode, RequestContext

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Fail:
    """A queued instruction to end a request with an error (keeps the send on the request's own shard)."""

    code: ErrorCode
    message: str


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
        still_serving: Callable[[], bool] | None = None,
    ) -> None:
        self.executor = executor
        self.detokenizer_factory = detokenizer_factory
        self.await_timeout_s = await_timeout_s
        self.cancel_check_s = cancel_check_s
        self.max_open_requests = max_open_requests
        self.on_finished = on_finished
        self.on_failure = on_failure
        self.still_serving = still_serving
        self.failure: str | None = None
        self._lock = threading.Condition()
        self._open: dict[int, RequestContext] = {}
        # Triton request id -> the requests in flight under it (several for a batched request), for `stop`.
        self._by_triton_id: dict[str, list[RequestContext]] = {}
        self._accepting = True
        self._running = True
        # Workers' shared state, under `_work`: requests with something to deliver, and whether a worker is
        # waiting on the executor.
        self._work = threading.Condition(threading.Lock())
        self._ready: deque[RequestContext] = deque()
        self._polling = False
        self._threads = [
            threading.Thread(target=self._work_loop, name=f"worker-{i}", daemon=True)
            for i in range(max(1, sender_threads) + 1)
        ]
        self._threads.append(threading.Thread(target=self._cancel_loop, name="cancel-watch", daemon=True))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

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
                try:
                    # Enqueue under the lock: the poller can't route a step for this id before it is registered.
                    ctx.executor_id = self.executor.enqueue(ctx.parsed.generation)
                except RequestRejected as exc:
                    refusal = (ErrorCode.UNSUPPORTED if exc.unsupported else ErrorCode.INVALID_ARG, str(exc))
                except ExecutorError as exc:
                    refusal = (ErrorCode.UNAVAILABLE, f"executor unavailable: {exc}")
                except Exception as exc:  # an engine bug must not escape execute() and kill the batch
                    log.exception("enqueue failed")
                    refusal = (ErrorCode.INTERNAL, f"enqueue failed: {exc}")
            if refusal is None:
                ctx.enqueued_ns = time.monotonic_ns()
                self._open[ctx.executor_id] = ctx
                if ctx.triton_request_id:
                    self._by_triton_id.setdefault(ctx.triton_request_id, []).append(ctx)
                self._lock.notify_all()
                return
        self._send_error_now(ctx, *refusal)

    def _refusal(self) -> tuple[ErrorCode, str] | None:
        if self.failure is not None:
            return ErrorCode.UNAVAILABLE, f"model not ready: {self.failure}"
        if not self._accepting:
            return ErrorCode.UNAVAILABLE, "model is shutting down"
        if self.max_open_requests is not None and len(self._open) >= self.max_open_requests:
            return ErrorCode.UNAVAILABLE, f"queue full: {len(self._open)} requests in flight (max_queue_size reached)"
        return None

    def _stop_by_triton_id(self, ctx: RequestContext) -> None:
        if not ctx.triton_request_id:
            self._send_error_now(ctx, ErrorCode.INVALID_ARG, "stop: needs the request id of the request to cancel")
            return
        with self._lock:
            targets = list(self._by_triton_id.get(ctx.triton_request_id, ()))
        # An id no longer in flight (the request just ended) is no error, as in NVIDIA's model: a client that
        # stops after a delay must not fail because generation was quicker.
        for target in targets:
            target.stopped = True
            self._cancel(target)
        try:
            ctx.stream.send({}, final=True)  # an empty response, as NVIDIA's: every client sees its end
        except Exception:
            log.warning("could not answer a stop request", exc_info=True)

    @property
    def open_requests(self) -> int:
        with self._lock:
            return len(self._open)

    # -- shutdown ----------------------------------------------------------------------------------------------
    def shutdown(self, reason: str = "model is shutting down", timeout_s: float = 10.0) -> None:
        """End every open stream with UNAVAILABLE, stop the executor and join every thread."""
        with self._lock:
            self._accepting = False
        self._fail_all(ErrorCode.UNAVAILABLE, reason)
        self._running = False
        with self._lock:
            self._lock.notify_all()
        try:
            self.executor.shutdown()
        except Exception:
            log.exception("executor shutdown failed")
        with self._work:
            self._work.notify_all()  # workers deliver what is ready (the failures above), then exit
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _fail_all(self, code: ErrorCode, message: str) -> None:
        with self._lock:
            contexts = list(self._open.values())
            self._open.clear()
            self._by_triton_id.clear()
        with self._work:
            for ctx in contexts:
                self._post(ctx, _Fail(code, message))
            self._work.notify_all()

    # -- workers -----------------------------------------------------------------------------------------------
    def _work_loop(self) -> None:
        while True:
            with self._work:
                while True:
                    # The poll role comes first: were it taken only when no request is ready, a backlog of ready
                    # requests would keep every worker sending and new steps, first tokens included, would wait a
                    # whole delivery round (seen on the H200 host: 290 ms at 1024 streams, time to first token
                    # equal to the gap between a stream's responses).
                    if not self._polling and self._running and self.failure is None:
                        self._polling = True
                        ctx = None
                        break
                    if self._ready:
                        ctx = self._ready.popleft()
                        break
                    if not self._running:
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
            self._executor_failed(dead)  # sets `failure` first: no worker polls again
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

    def _route(self, steps: list[Step]) -> list[tuple[RequestContext, Step]]:
        with self._lock:
            routed = []
            for step in steps:
                ctx = self._open.get(step.request_id)
                if ctx is None:
                    continue  # already ended (failed send, shutdown): the executor's late steps are dropped
                if step.is_final:
                    del self._open[step.request_id]
                    self._unregister_id(ctx)
                routed.append((ctx, step))
        return routed

    def _post(self, ctx: RequestContext, item: Step | _Fail) -> None:
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

    def _deliver_ready(self, ctx: RequestContext) -> None:
        with self._work:
            work, ctx.mailbox = ctx.mailbox, []
        self._deliver(ctx, work)
        with self._work:
            if ctx.mailbox:  # more arrived while sending: back of the queue, delivered in a later turn
                self._ready.append(ctx)
            else:
                ctx.scheduled = False

    def _executor_failed(self, reason: str) -> None:
        log.error("executor failed: %s", reason)
        self.failure = reason
        self._fail_all(ErrorCode.UNAVAILABLE, f"executor failed: {reason}")
        if self.on_failure is not None:
            try:
                self.on_failure(reason)
            except Exception:
                log.exception("on_failure hook failed")

    # -- delivery ---------------------------------------------------------------------------------------------
    def _deliver(self, ctx: RequestContext, work: list) -> None:
        # Under the request's lock: the cancel watcher must never ask Triton about a request whose final
        # response is being sent (tritonserver 2.51 segfaults in ResponseFactoryIsCancelled after the final).
        with ctx.lock:
            if ctx.done:
                return
            self._deliver_locked(ctx, work)
            finished = ctx.done
        if finished and self.on_finished is not None:
            # After the final response left: the metrics' bookkeeping stays off the time-to-last-token path.
            try:
                self.on_finished(ctx)
            except Exception:
                log.exception("on_finished hook failed")

    def _deliver_locked(self, ctx: RequestContext, work: list) -> None:
        try:
            failure = next((w for w in work if isinstance(w, _Fail)), None)
            steps = [w for w in work if isinstance(w, Step)]
            if steps:
                self._send_steps(ctx, steps, final_allowed=failure is None)
            if failure is not None and not ctx.done:
                self._finish(ctx, "error")
                ctx.stream.send_error(failure.code, failure.message)
        except Exception as exc:
            # A failed send (client gone) or a bug while building the response: end only this request, and
            # still try to give it its final response (which fails too if the client is gone).
            log.warning("delivery failed for request %s: %s", ctx.executor_id, exc, exc_info=not _is_send_error(exc))
            if not ctx.done:
                self._finish(ctx, "cancelled" if _is_send_error(exc) else "error")  # client gone: cancelled
                with contextlib.suppress(Exception):  # if the stream is gone, nobody is left to tell
                    ctx.stream.send_error(ErrorCode.INTERNAL, f"response failed: {exc}")
            self._cancel(ctx)
            self._forget(ctx)

    def _send_steps(self, ctx: RequestContext, steps: list[Step], final_allowed: bool) -> None:
        last = steps[-1]
        new_tokens = [t for s in steps for t in s.token_ids]
        new_log_probs = [p for s in steps for p in (s.log_probs or [])]
        new_logits = [s.generation_logits for s in steps if s.generation_logits is not None]
        if last.beams is not None and new_logits:
            new_logits = new_logits[-1:]  # with beams each step carries every beam in full so far, logits too
        now = time.monotonic_ns()
        if new_tokens or last.beams is not None:
            ctx.first_token_ns = ctx.first_token_ns or now
            ctx.last_token_ns = now
        ctx.num_output_tokens += len(new_tokens)
        ctx.log_probs.extend(new_log_probs)
        if last.cum_log_prob is not None:
            ctx.cum_log_prob = last.cum_log_prob
        if ctx.parsed.generation.return_context_logits or ctx.parsed.return_perf_metrics:  # off the common path
            for step in steps:
                if step.context_logits is not None:
                    ctx.context_logits = step.context_logits
                for name in ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks"):
                    if getattr(step, name) is not None:
                        ctx.kv_cache_blocks[name] = getattr(step, name)
        final = last.is_final and final_allowed
        error = next((s.error for s in steps if s.error), None)
        streaming = ctx.parsed.generation.streaming
        if not streaming:
            ctx.output_ids.extend(new_tokens)
            ctx.generation_logits.extend(new_logits)

        if error is not None:
            self._finish(ctx, "error")
            ctx.stream.send_error(ErrorCode.INTERNAL, f"executor error: {error}")
            return
        if final:
            self._finish(ctx, last.finish_reason.value)
        client_cancelled = final and last.finish_reason is FinishReason.CANCELLED and not ctx.stopped
        if streaming:
            text = self._text_delta(ctx, new_tokens, final)
            outputs = None
            # A final response always carries outputs (empty if nothing is new): tritonclient hands a flag-only
            # final to no callback, so a client would never see its request end.
            if new_tokens or last.beams is not None or text or final:
                outputs = self._outputs(ctx, new_tokens, text, new_log_probs, last, new_logits)
            if client_cancelled:
                if new_tokens or text:
                    ctx.stream.send(outputs, final=False)
                ctx.stream.send_error(ErrorCode.CANCELLED, "request cancelled")
            elif outputs is not None:
                ctx.stream.send(outputs, final=final)
        elif final:
            if client_cancelled:
                ctx.stream.send_error(ErrorCode.CANCELLED, "request cancelled")
                return
            prompt = [] if ctx.parsed.generation.exclude_input_in_output else ctx.parsed.prompt_ids
            tokens = prompt + ctx.output_ids
            text = None
            if ctx.parsed.text_mode and last.beams is None:
                text = self._text_delta(ctx, tokens, True)
            ctx.stream.send(self._outputs(ctx, tokens, text, ctx.log_probs, last, ctx.generation_logits, prompt), final=True)

    def _outputs(
        self,
        ctx: RequestContext,
        tokens: list[int],
        text: str | None,
        log_probs: list[float],
        last: Step,
        generation_logits: list,
        prompt: list[int] | None = None,
    ) -> dict:
        if last.beams is not None:  # every beam in full so far
            beams = [(prompt or []) + beam for beam in last.beams]
            texts = [self._decode(beam) for beam in beams] if ctx.parsed.text_mode else None
            beam_log_probs, cum = last.beam_log_probs, last.beam_cum_log_probs
        else:
            beams, texts = [tokens], [text or ""]
            beam_log_probs = [log_probs]
            cum = None if ctx.cum_log_prob is None else [ctx.cum_log_prob]
        content = ResponseContent(
            beams=beams,
            texts=texts,
            log_probs=beam_log_probs,
            cum_log_probs=cum,
            finish_reason=ctx.finish_reason,
            num_output_tokens=ctx.num_output_tokens,
            sequence_index=last.sequence_index,
            context_logits=ctx.context_logits,
            generation_logits=_concat_logits(generation_logits) if generation_logits else None,
            perf=self._perf(ctx) if ctx.parsed.return_perf_metrics else None,
        )
        # Context logits go with every response, as TensorRT-LLM's results carry them (NVIDIA's client keeps the last).
        return response_outputs(ctx.parsed, content)

    @staticmethod
    def _perf(ctx: RequestContext) -> dict[str, float]:
        # Timestamps on the steady clock, as TensorRT-LLM's (time.monotonic_ns is CLOCK_MONOTONIC, as its
        # std::chrono::steady_clock on Linux). First scheduled = handed to the executor; no speculative decoding
        # here, so the draft-token counts are truly 0.
        return {
            "arrival_time_ns": ctx.arrival_ns,
            "first_scheduled_time_ns": ctx.enqueued_ns,
            "first_token_time_ns": ctx.first_token_ns,
            "last_token_time_ns": ctx.last_token_ns,
            "acceptance_rate": 0.0,
            "total_accepted_draft_tokens": 0,
            "total_draft_tokens": 0,
            **ctx.kv_cache_blocks,
        }

    def _decode(self, tokens: list[int]) -> str:
        if self.detokenizer_factory is None:
            return ""
        detokenizer = self.detokenizer_factory()
        return detokenizer.push(tokens) + detokenizer.flush()

    @staticmethod
    def _text_delta(ctx: RequestContext, tokens: list[int], final: bool) -> str | None:
        if ctx.detokenizer is None:
            return None
        text = ctx.detokenizer.push(tokens) if tokens else ""
        return text + ctx.detokenizer.flush() if final else text

    @staticmethod
    def _finish(ctx: RequestContext, reason: str) -> None:
        """Mark the request ended before its final response is sent (`_deliver` reports it once sent)."""
        ctx.done = True
        ctx.finish_reason = reason

    def _send_error_now(self, ctx: RequestContext, code: ErrorCode, message: str) -> None:
        ctx.done = True
        try:
            ctx.stream.send_error(code, message)
        except Exception:
            log.warning("could not send a refusal", exc_info=True)

    def _forget(self, ctx: RequestContext) -> None:
        with self._lock:
            if self._open.get(ctx.executor_id) is ctx:
                del self._open[ctx.executor_id]
            self._unregister_id(ctx)

    def _unregister_id(self, ctx: RequestContext) -> None:
        """Forget `ctx` under its Triton request id (caller holds `_lock`)."""
        siblings = self._by_triton_id.get(ctx.triton_request_id)
        if siblings is not None and ctx in siblings:
            siblings.remove(ctx)
            if not siblings:
                del self._by_triton_id[ctx.triton_request_id]

    def _cancel(self, ctx: RequestContext) -> None:
        if ctx.cancel_requested:
            return
        ctx.cancel_requested = True
        try:
            self.executor.cancel(ctx.executor_id)
        except Exception:
            log.exception("executor cancel failed for %s", ctx.executor_id)

    # -- cancel watcher ----------------------------------------------------------------------------------------
    def _cancel_loop(self) -> None:
        while self._running:
            with self._lock:
                if not self._open:
                    self._lock.wait()  # nothing in flight: sleep until a submit (or shutdown) wakes us
                    continue
            # A period first: a request that just arrived has not been cancelled yet, and asking (an IPC round trip
            # each) while its executor step is starting would only compete with it.
            time.sleep(self.cancel_check_s)
            # Readiness before cancellations: once the model is being unloaded, asking Triton about a request can
            # hang (one forwarded by an `ensemble` that is already gone), and this loop must still end the streams.
            if self._check_still_serving():
                continue
            with self._lock:
                contexts = [c for c in self._open.values() if not c.cancel_requested]
            for ctx in contexts:
                with ctx.lock:  # see _deliver: never while (or after) its final response is sent
                    if ctx.done:
                        continue
                    try:
                        cancelled = ctx.stream.is_cancelled()
                    except Exception:
                        log.debug("is_cancelled failed", exc_info=True)
                        continue
                if cancelled:
                    self._cancel(ctx)

    def _check_still_serving(self) -> bool:
        """True once the model is being unloaded (every open stream has then been ended)."""
        # Triton unloads a decoupled model only after every open request got its final response, and calls
        # finalize() after that: a shutdown with streams open would wait forever. So while streams are open,
        # watch for the unload to begin and end them first.
        if not self._accepting:
            return True
        if self.still_serving is None:
            return False
        try:
            serving = self.still_serving()
        except Exception:
            log.debug("still_serving check failed", exc_info=True)
            return False
        if serving:
            return False
        log.warning("model is being unloaded: ending %d open streams", self.open_requests)
        with self._lock:
            self._accepting = False
        self._fail_all(ErrorCode.UNAVAILABLE, "model is shutting down")
        return True


def _is_send_error(exc: Exception) -> bool:
    # Triton's stub raises TritonModelException when a response can no longer be sent.
    return type(exc).__name__ == "TritonModelException"


def _concat_logits(parts: list):
    """Per-step [beams, tokens, vocab] logits -> one [beams, tokens, vocab] array."""
    return parts[0] if len(parts) == 1 else np.concatenate([np.asarray(part) for part in parts], axis=1)
