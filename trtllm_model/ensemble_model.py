"""The `ensemble` model: NVIDIA's text-level names, answered by the one `tensorrt_llm` model through BLS.

Clients written for NVIDIA's repository call `ensemble`; forwarding (instead of a second executor) keeps a single
copy of the weights in memory. Tokenization and detokenization happen inside `tensorrt_llm`, so this is one
pass-through hop per response. A client's cancellation becomes a `stop` request for the forwarded request id.

BLS responses arrive through a blocking iterator in this Triton release, so each forwarded request gets a thread
(it sleeps in the IPC wait with the GIL released); one watcher thread checks cancellations for all of them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

log = logging.getLogger("trtllm_model.ensemble")

TARGET_MODEL = "tensorrt_llm"
TEXT_OUTPUTS = ["text_output", "output_log_probs", "cum_log_probs", "finish_reason", "num_input_tokens",
                "num_output_tokens", "sequence_index"]
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_CHECK_S = 0.1
FORWARDED_GRACE_S = 2.0


class _Forward:
    """A client request being forwarded: one sender, and a lock so that nothing is sent after its final response."""

    __slots__ = ("request", "sender", "lock", "done")

    def __init__(self, request) -> None:
        self.request = request
        self.sender = request.get_response_sender()
        self.lock = threading.Lock()
        self.done = False

    def send(self, response) -> None:
        with self.lock:
            if not self.done:
                self.sender.send(response)

    def finish(self, error=None) -> bool:
        """Send the final response (an error if given), unless one was sent already."""
        with self.lock:
            if self.done:
                return False
            self.done = True
            if error is not None:
                self.sender.send(pb_utils.InferenceResponse(error=error), flags=_FINAL)
            else:
                self.sender.send(flags=_FINAL)
            return True


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self._name = args["model_name"]
        self._ids = itertools.count(1)
        self._prefix = f"ensemble-{os.getpid()}-"
        self._lock = threading.Condition()
        self._open: dict[str, _Forward] = {}  # forwarded id -> client request, for the watcher
        self._running = True
        self._watcher = threading.Thread(target=self._watch_cancellations, name="ensemble-cancel", daemon=True)
        self._watcher.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            forwarded_id = f"{self._prefix}{next(self._ids)}"
            forward = _Forward(request)
            with self._lock:
                self._open[forwarded_id] = forward
                self._lock.notify_all()
            threading.Thread(target=self._forward, args=(forward, forwarded_id), daemon=True).start()
        return None

    def _forward(self, forward: _Forward, forwarded_id: str) -> None:
        request = forward.request
        error = None
        complete = False  # tensorrt_llm's last response of a finished request carries outputs
        try:
            parameters = json.loads(request.parameters() or "{}")
            inner = pb_utils.InferenceRequest(
                model_name=TARGET_MODEL,
                inputs=request.inputs(),
                requested_output_names=list(request.requested_output_names()) or TEXT_OUTPUTS,
                request_id=forwarded_id,
                parameters={k: v for k, v in parameters.items() if not k.startswith("triton_")},
            )
            for response in inner.exec(decoupled=True):
                if response.has_error():
                    error = response.error()
                    continue  # a forwarded request's error is not final (see triton_io.TritonStream.send_error)
                tensors = response.output_tensors()
                complete = bool(tensors)
                if tensors:
                    forward.send(pb_utils.InferenceResponse(output_tensors=tensors))
        except Exception as exc:
            error = _forwarding_error(exc)
        # Leave the watcher's view before the final response: asking Triton whether a finished request was
        # cancelled crashes tritonserver 2.51 (ResponseFactoryIsCancelled on a released factory).
        with self._lock:
            if self._open.pop(forwarded_id, None) is None:
                return  # the watcher ended this stream (the model is being unloaded)
        if error is None and not complete:
            # A flag-only final: tensorrt_llm ended the request with an error (stop, unload, executor failure),
            # and Triton 2.51 does not pass that error response to a BLS caller (see TritonStream.send_error).
            # No readiness question here: it can block while the server stops.
            error = pb_utils.TritonError(f"UNAVAILABLE: {TARGET_MODEL} ended the request early",
                                         pb_utils.TritonError.UNAVAILABLE)
        forward.finish(error)

    def _watch_cancellations(self) -> None:
        cancelled: set[str] = set()
        unloading_since = None
        while self._running:
            with self._lock:
                if not self._open:
                    self._lock.wait()
                    continue
                # is_cancelled() under the lock, so that no request is asked about after its final response.
                newly = [fid for fid, f in self._open.items() if fid not in cancelled and f.request.is_cancelled()]
                cancelled.update(newly)
                cancelled &= set(self._open)
            for forwarded_id in newly:
                _send_stop(forwarded_id)
            if unloading_since is None and not _ready(self._name):
                unloading_since = time.monotonic()
            # Let tensorrt_llm end the forwarded requests first (it sees the stop too): once this model is gone,
            # tensorrt_llm's questions about those requests (is_cancelled) can hang in 2.51. End the rest here.
            if unloading_since is not None and time.monotonic() - unloading_since > FORWARDED_GRACE_S:
                self._end_open_streams()
            with self._lock:
                self._lock.wait(CANCEL_CHECK_S)

    def _end_open_streams(self) -> None:
        # Triton unloads this model (and a stopping server exits) only once every client request has had its
        # final response; end them here instead of waiting for each forwarded request to come back.
        with self._lock:
            forwards = list(self._open.values())
            self._open.clear()
        for forward in forwards:
            try:
                forward.finish(pb_utils.TritonError("UNAVAILABLE: model is shutting down", pb_utils.TritonError.UNAVAILABLE))
            except Exception:
                log.debug("could not end a stream", exc_info=True)
        if forwards:
            log.warning("model is being unloaded: ended %d forwarded streams", len(forwards))

    def is_ready(self) -> bool:
        """Readiness for servers that ask (26.03+): ready while the model it forwards to is."""
        return pb_utils.is_model_ready(TARGET_MODEL)

    def finalize(self) -> None:
        with self._lock:
            self._running = False
            self._lock.notify_all()
        self._watcher.join(timeout=2)


def _send_stop(forwarded_id: str) -> None:
    stop = pb_utils.InferenceRequest(
        model_name=TARGET_MODEL,
        inputs=[pb_utils.Tensor("stop", np.array([[True]]))],
        requested_output_names=[],
        request_id=forwarded_id,
    )
    try:
        for _ in stop.exec(decoupled=True):
            pass
    except Exception:
        log.warning("could not forward a cancellation", exc_info=True)


def _ready(model: str) -> bool:
    try:
        return pb_utils.is_model_ready(model)
    except Exception:
        return False  # a stopping server answers "Server not ready"


def _forwarding_error(exc: Exception):
    if not _ready(TARGET_MODEL):
        # The executor failed and tensorrt_llm unloaded itself: the same answer its own clients get.
        return pb_utils.TritonError(f"UNAVAILABLE: {TARGET_MODEL} is not ready", pb_utils.TritonError.UNAVAILABLE)
    log.exception("forwarding to %s failed", TARGET_MODEL)
    return pb_utils.TritonError(f"INTERNAL: ensemble forwarding failed: {exc}", pb_utils.TritonError.INTERNAL)
