"""The Triton edge: request tensors in, response senders out. The only module besides model.py that touches
`triton_python_backend_utils`."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from .request_context import ErrorCode

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def triton_error(code: ErrorCode, message: str):
    # pb_utils.TritonError only exists once the stub has started the model (not at import time).
    return pb_utils.TritonError(message, getattr(pb_utils.TritonError, code.value))


def request_tensors(request) -> dict[str, np.ndarray]:
    """Every input tensor of a Triton request, by name."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}


def request_parameters_json(request) -> str:
    return request.parameters()


class TritonStream:
    """A request's response sender, behind the poller's ResponseStream protocol."""

    __slots__ = ("_request", "_sender")

    def __init__(self, request) -> None:
        self._request = request
        self._sender = request.get_response_sender()

    def send(self, outputs: dict[str, np.ndarray] | None, final: bool) -> None:
        flags = _FINAL if final else 0
        if outputs is None:
            self._sender.send(flags=flags)
            return
        tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items()]
        self._sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)

    def send_error(self, code: ErrorCode, message: str) -> None:
        self._sender.send(pb_utils.InferenceResponse(error=triton_error(code, message)), flags=_FINAL)

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()
