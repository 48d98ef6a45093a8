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

import numpy as np
import triton_python_backend_utils as pb_utils

log = logging.getLogger("trtllm_model.ensemble")

TARGET_MODEL = "tensorrt_llm"
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_CHECK_S = 0.1


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        self._outputs = [output["name"] for output in model_config.get("output", [])]
        # Decoupled or not, each response goes out as soon as it arrives and the one that ends the request carries
        # the FINAL flag (as NVIDIA's ensemble): a non-decoupled client gets exactly that one response.
        self._ids = itertools.count(1)
        self._prefix = f"ensemble-{os.getpid()}-"
        self._lock = threading.Condition()
        self._open: dict[str, object] = {}  # forwarded id -> client request, for the cancel watcher
        self._running = True
        self._watcher = threading.Thread(target=self._watch_cancellations, name="ensemble-cancel", daemon=True)
        self._watcher.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            forwarded_id = f"{self._prefix}{next(self._ids)}"
            with self._lock:
                self._open[forwarded_id] = request
                self._lock.notify_all()
            threading.Thread(target=self._forward, args=(request, forwarded_id), daemon=True).start()
        return None

    def _forward(self, request, forwarded_id: str) -> None:
        sender = request.get_response_sender()
        error, final_sent = None, False
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
            requested = list(request.requested_output_names()) or self._outputs
            inner = pb_utils.InferenceRequest(
                model_name=TARGET_MODEL,
                inputs=inputs,
                requested_output_names=sorted(set(requested) | {"finish_reason"}),
                request_id=forwarded_id,
                parameters={k: v for k, v in parameters.items() if not k.startswith("triton_")},
            )
            for response in inner.exec(decoupled=True):
                if final_sent:
                    continue  # the iterator ends after the forwarded request's final response
                if response.has_error():
                    error = _with_code(response.error())
                    break
                tensors = response.output_tensors()
                reason = next((_reason(t) for t in tensors if t.name() == "finish_reason"), None)
                if not client_wants_reason:
                    tensors = [t for t in tensors if t.name() != "finish_reason"]
                if reason is not None:  # a sequence's last response (errors end the loop above)
                    sequences_left -= 1
                final = sequences_left == 0
                if tensors or final:
                    sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=_FINAL if final else 0)
                    final_sent = final
        except Exception as exc:
            error = _forwarding_error(exc)
        # Leave the watcher's view before the final response: asking Triton whether a finished request was
        # cancelled crashes tritonserver 2.51 (ResponseFactoryIsCancelled on a released factory).
        with self._lock:
            self._open.pop(forwarded_id, None)
        if error is not None:
            sender.send(pb_utils.InferenceResponse(error=error), flags=_FINAL)
        elif not final_sent:
            sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=_FINAL)

    def _watch_cancellations(self) -> None:
        cancelled: set[str] = set()
        while self._running:
            with self._lock:
                if not self._open:
                    self._lock.wait()
                    continue
                # is_cancelled() under the lock, so that no request is asked about after its final response.
                newly = [fid for fid, req in self._open.items() if fid not in cancelled and req.is_cancelled()]
                cancelled.update(newly)
                cancelled &= set(self._open)
            for forwarded_id in newly:
                _send_stop(forwarded_id)
            with self._lock:
                self._lock.wait(CANCEL_CHECK_S)

    def is_ready(self) -> bool:
        """Readiness for servers that ask (26.03+): ready while the model it forwards to is."""
        return pb_utils.is_model_ready(TARGET_MODEL)

    def finalize(self) -> None:
        with self._lock:
            self._running = False
            self._lock.notify_all()
        self._watcher.join(timeout=2)


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


def _forwarding_error(exc: Exception):
    if not pb_utils.is_model_ready(TARGET_MODEL):
        # The executor failed and tensorrt_llm unloaded itself: the same answer its own clients get.
        return pb_utils.TritonError(f"UNAVAILABLE: {TARGET_MODEL} is not ready", pb_utils.TritonError.UNAVAILABLE)
    log.exception("forwarding to %s failed", TARGET_MODEL)
    return pb_utils.TritonError(f"INTERNAL: ensemble forwarding failed: {exc}", pb_utils.TritonError.INTERNAL)
