"""The BLS relay under `tensorrt_llm_bls`: NVIDIA's text-level names, answered by the `tensorrt_llm` model through
BLS (one copy of the weights; tokenization and detokenization happen inside `tensorrt_llm`). A client's
cancellation becomes a `stop` request for the forwarded request id.

`ensemble` is not served this way any more: it is a Triton ensemble (model_repository/ensemble/config.pbtxt), whose
responses Triton's core passes on without a Python hop. Under load Triton 2.51's stub can deadlock in the BLS
iterators this relay needs (docs/reliability.md, "`ensemble` under load"); `tensorrt_llm_bls` keeps that risk, as
NVIDIA's own BLS model does.

BLS responses arrive through a blocking iterator in this Triton release, so each forwarded request gets a thread
(it sleeps in the IPC wait with the GIL released); one watch (watches.StreamWatch, as tensorrt_llm's) checks
cancellations for all of them, and ends the streams still open when the model is being unloaded (a server stop),
so the unload never waits on them.

Forwarded request ids are random (128 bits): `stop` cancels by request id, and a client that could guess another's
forwarded id could stop that client's stream.

Each finished BLS response iterator is kept for RELEASE_AFTER_S before this model lets it go (IteratorKeeper): in
Triton 2.51 the stub frees an iterator, with every response it kept, on whichever thread drops it last, and when that
is the stub's own C++ thread it frees their numpy arrays without the GIL, which corrupts the stub's heap (segfaults,
"Stub process '..._0_0' is not healthy"; docs/performance.md).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import deque

import numpy as np
import triton_python_backend_utils as pb_utils

from ..serving.watches import StreamWatch
from .triton_io import FORWARDED_ID_PREFIX, unload_check

log = logging.getLogger("trtllm_model.bls")

TARGET_MODEL = "tensorrt_llm"
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_CHECK_S = 0.1
# On unload, how long tensorrt_llm gets to end the forwarded requests itself before the watcher ends the rest.
FORWARDED_GRACE_S = 2.0
# How long a finished BLS response iterator stays referenced here: far beyond the time the stub's stub-to-parent
# thread takes to reach the iterator's cleanup message (one IPC round trip per message queued before it).
RELEASE_AFTER_S = 5.0


class Refused(ValueError):
    """A request the forwarding model itself refuses (INVALID_ARG)."""


class _Forward:
    """A client request being forwarded: its one sender, and a lock so that nothing is sent after its final."""

    __slots__ = ("request", "forwarded_id", "sender", "lock", "done", "cancelled")

    def __init__(self, request, forwarded_id: str) -> None:
        self.request = request
        self.forwarded_id = forwarded_id
        self.sender = request.get_response_sender()
        self.lock = threading.Lock()
        self.done = False
        self.cancelled = False  # the client cancelled (set by the watcher)

    def send(self, response) -> None:
        with self.lock:
            if not self.done:
                self.sender.send(response)

    def finish(self, response) -> None:
        with self.lock:
            if not self.done:
                self.done = True
                self.sender.send(response, flags=_FINAL)


class IteratorKeeper:
    """Holds finished BLS response iterators for `hold_s`, so that the last reference to each is dropped by one of
    this model's Python threads (holding the GIL), never by the stub's stub-to-parent thread.

    Triton 2.51's stub keeps its own reference to a decoupled BLS iterator in a map until its stub-to-parent thread
    handles the iterator's cleanup message, which it queues behind the other stub-to-parent messages (cancellation
    checks, other cleanups). If Python dropped the iterator first, that thread destroys it, and with it every
    response it kept, whose numpy arrays it then frees without the GIL (fixed upstream after 24.10: python_backend
    PR #390 takes the GIL in the tensor's destructor)."""

    def __init__(self, hold_s: float = RELEASE_AFTER_S) -> None:
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._held: deque[tuple[float, object]] = deque()

    def keep(self, iterator: object) -> None:
        """Hold `iterator` (fully read); drop, on this thread, those held longer than `hold_s`."""
        now = time.monotonic()
        expired = []
        with self._lock:
            self._held.append((now + self.hold_s, iterator))
            while self._held and self._held[0][0] <= now:
                expired.append(self._held.popleft()[1])
        expired.clear()  # the last references, dropped here with the GIL and outside the lock


class ForwardingModel:
    target = TARGET_MODEL  # the model requests are forwarded to (tensorrt_llm_bls: its tensorrt_llm_model_name)

    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        self._outputs = [output["name"] for output in model_config.get("output", [])]
        # Decoupled or not, each response goes out as soon as it arrives and the one that ends the request carries
        # the FINAL flag (as NVIDIA's ensemble): a non-decoupled client gets exactly that one response.
        self._name = args["model_name"]
        self._lock = threading.Lock()  # guards `_open` only; no IPC call is made while holding it
        self._open: dict[str, _Forward] = {}  # forwarded id -> client request, for the watch
        self._unloading_since: float | None = None
        self._target_unloading = unload_check(self.target)
        self._iterators = IteratorKeeper()
        self._watch = StreamWatch(
            "bls-cancel",
            CANCEL_CHECK_S,
            open_items=self._open_snapshot,
            is_cancelled=_client_cancelled,
            on_cancelled=self._forward_cancellation,
            unloading=unload_check(self._name),
            on_unload=self._unloading_seen,
        )
        self._watch.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            forwarded_id = f"{FORWARDED_ID_PREFIX}{secrets.token_hex(16)}"
            forward = _Forward(request, forwarded_id)
            with self._lock:
                self._open[forwarded_id] = forward
            self._watch.notify()
            threading.Thread(target=self._forward, args=(forward, forwarded_id), daemon=True).start()
        return None

    def _forward(self, forward: _Forward, forwarded_id: str) -> None:
        request = forward.request
        error, final_sent = None, False
        responses, read_all = None, False
        try:
            parameters = json.loads(request.parameters() or "{}")
            inputs = request.inputs()
            client_wants_reason = _flag(inputs, "return_finish_reason")
            # A batched request (several prompts) ends after one final response per prompt.
            sequences_left = _batch_size(inputs)
            if not client_wants_reason:
                # A sequence's last response is the one with a finish reason: the last of them is sent on as FINAL.
                inputs = [t for t in inputs if t.name() != "return_finish_reason"]
                inputs.append(pb_utils.Tensor("return_finish_reason", np.ones((sequences_left, 1), dtype=bool)))
            stream_state = self._stream_state(inputs, sequences_left)
            requested = list(request.requested_output_names()) or self._outputs
            inner = pb_utils.InferenceRequest(
                model_name=self.target,
                inputs=inputs,
                requested_output_names=sorted(set(requested) | {"finish_reason"}),
                request_id=forwarded_id,
                parameters={k: v for k, v in parameters.items() if not k.startswith("triton_")},
            )
            responses = inner.exec(decoupled=True)
            # Read to the end: the iterator must see the forwarded request's own final response.
            for response in responses:
                if final_sent:
                    continue
                if response.has_error():
                    error = _with_code(response.error())
                    continue
                tensors = response.output_tensors()
                reason = next((_reason(t) for t in tensors if t.name() == "finish_reason"), None)
                if not client_wants_reason:
                    tensors = [t for t in tensors if t.name() != "finish_reason"]
                tensors = self._outgoing(tensors, stream_state)
                if reason is not None:  # a sequence's last response
                    sequences_left -= 1
                if sequences_left == 0:
                    final_sent = True
                    self._finish(forwarded_id, pb_utils.InferenceResponse(output_tensors=tensors))
                elif tensors:
                    forward.send(pb_utils.InferenceResponse(output_tensors=tensors))
            read_all = True
        except Refused as exc:
            error = pb_utils.TritonError(f"INVALID_ARG: {exc}", pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:
            error = self._forwarding_error(exc)
        if not final_sent:
            if error is None:
                # The forwarded request ended without finishing every sequence: tensorrt_llm ended it with an error
                # that Triton 2.51 does not pass to a BLS caller after earlier responses (TritonStream.send_error).
                error = (pb_utils.TritonError("CANCELLED: request cancelled", pb_utils.TritonError.CANCELLED)
                         if forward.cancelled else
                         pb_utils.TritonError(f"UNAVAILABLE: {self.target} ended the request early",
                                              pb_utils.TritonError.UNAVAILABLE))
            self._finish(forwarded_id, pb_utils.InferenceResponse(error=error))
        if responses is not None:
            self._retire(responses, read_all)

    def _retire(self, responses, read_all: bool) -> None:
        """Hand a BLS response iterator to the keeper, read to its end first (a stopped read leaves it unfinished)."""
        if not read_all:
            try:
                for _ in responses:
                    pass
            except Exception:
                log.debug("could not read a forwarded request to its end", exc_info=True)
        self._iterators.keep(responses)

    def _forwarding_error(self, exc: Exception):
        try:
            unloaded = self._target_unloading()
        except Exception:
            unloaded = False
        if unloaded:
            # The executor failed and tensorrt_llm unloaded itself: the same answer its own clients get.
            return pb_utils.TritonError(f"UNAVAILABLE: {self.target} is not ready", pb_utils.TritonError.UNAVAILABLE)
        log.exception("forwarding to %s failed", self.target)
        return pb_utils.TritonError(f"INTERNAL: {self._name} forwarding failed: {exc}", pb_utils.TritonError.INTERNAL)

    def _stream_state(self, inputs: list, sequences: int) -> object:
        """Per-request state for `_outgoing` (None here); raise Refused for a request this model refuses."""
        return None

    def _outgoing(self, tensors: list, state: object) -> list:
        """The tensors of one forwarded response as the client gets them (unchanged here)."""
        return tensors

    def _forward_cancellation(self, forward: _Forward) -> None:
        forward.cancelled = True
        # On its own thread: a BLS call the watch waited on could hold every other stream's watch.
        threading.Thread(target=self._send_stop, args=(forward.forwarded_id,), daemon=True).start()

    def _send_stop(self, forwarded_id: str) -> None:
        stop = pb_utils.InferenceRequest(
            model_name=self.target,
            inputs=[pb_utils.Tensor("stop", np.array([[True]]))],
            requested_output_names=[],
            request_id=forwarded_id,
        )
        try:
            responses = stop.exec(decoupled=True)
        except Exception:
            log.warning("could not forward a cancellation", exc_info=True)
            return
        self._retire(responses, read_all=False)

    def _finish(self, forwarded_id: str, response) -> None:
        # Leave the watcher's view before the final response: asking Triton whether a finished request was
        # cancelled crashes tritonserver 2.51 (ResponseFactoryIsCancelled on a released factory).
        with self._lock:
            forward = self._open.pop(forwarded_id, None)
        if forward is not None:  # else the watcher ended this stream (the model is being unloaded)
            forward.finish(response)

    def _open_snapshot(self) -> list[_Forward]:
        with self._lock:
            return [forward for forward in self._open.values() if not forward.cancelled]

    def _unloading_seen(self) -> None:
        # tensorrt_llm sees the unload too and ends its requests first; once it is gone, its questions about
        # requests forwarded from here can hang in 2.51. So after a grace period the watch ends the rest.
        if self._unloading_since is None:
            self._unloading_since = time.monotonic()
        elif time.monotonic() - self._unloading_since > FORWARDED_GRACE_S:
            self._end_open_streams()

    def _end_open_streams(self) -> None:
        # Triton unloads this model (and a stopping server exits) only once every client request has had its
        # final response.
        with self._lock:
            forwards = list(self._open.values())
            self._open.clear()
        error = pb_utils.TritonError("UNAVAILABLE: model is shutting down", pb_utils.TritonError.UNAVAILABLE)
        for forward in forwards:
            try:
                forward.finish(pb_utils.InferenceResponse(error=error))
            except Exception:
                log.debug("could not end a stream", exc_info=True)
        if forwards:
            log.warning("model is being unloaded: ended %d forwarded streams", len(forwards))

    def is_ready(self) -> bool:
        """Readiness for servers that ask (26.03+): ready while the model it forwards to is served."""
        return not self._watch.unload_seen and not self._target_unloading()

    def finalize(self) -> None:
        self._watch.stop()


def _with_code(error):
    """The forwarded model's error with its code: a BLS response's error arrives as INTERNAL, but our messages
    lead with their code (triton_io.triton_error), which a unary client sees as the gRPC/HTTP status."""
    message = error.message()
    code = getattr(pb_utils.TritonError, message.split(":", 1)[0], None)
    return error if code is None else pb_utils.TritonError(message, code)


def _batch_size(tensors) -> int:
    text = next((t for t in tensors if t.name() == "text_input"), None)
    shape = text.as_numpy().shape if text is not None else ()
    return shape[0] if len(shape) >= 2 else 1


def _flag(tensors, name: str) -> bool:
    tensor = next((t for t in tensors if t.name() == name), None)
    return tensor is not None and bool(tensor.as_numpy().any())


def _reason(tensor) -> str:
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def _client_cancelled(forward: _Forward) -> bool | None:
    with forward.lock:  # never asked after its final response (tritonserver 2.51 crashes on that)
        if forward.done:
            return None
        return forward.request.is_cancelled()
