"""The Triton edge: request tensors in, response senders out. The only module besides model.py that touches
`triton_python_backend_utils`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import triton_python_backend_utils as pb_utils

from ..server import READY_URL_ENV
from ..serving import watches
from ..serving.request_context import ErrorCode

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Request ids the `tensorrt_llm_bls` model gives the requests it forwards here (see send_error).
FORWARDED_ID_PREFIX = "bls-forwarded-"


def triton_error(code: ErrorCode, message: str):
    # The code also leads the message: gRPC streams and HTTP generate in Triton 2.51 pass only the message to
    # clients, and a client must be able to tell a retryable UNAVAILABLE from its own INVALID_ARG.
    # (pb_utils.TritonError only exists once the stub has started the model, not at import time.)
    return pb_utils.TritonError(f"{code.value}: {message}", getattr(pb_utils.TritonError, code.value))


def request_tensors(request) -> dict[str, np.ndarray]:
    """Every input tensor of a Triton request, by name."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}


def request_parameters_json(request) -> str:
    return request.parameters()


def unload_check(name: str) -> Callable[[], bool]:
    """A check that returns True once Triton confirms that model `name` is being unloaded or the server is stopping;
    an error is no confirmation (see watches.UnloadProbe).

    Asked over the server's HTTP endpoint where `trtllm-triton serve` (or launch_trtllm.sh) gave its address:
    pb_utils.is_model_ready, asked while tritonserver stops by itself, now and then segfaults the stub (gdb: inside
    IsModelReady's shared memory message; docs/reliability.md, "Stopping"). It is the fallback without an address."""
    base = os.environ.get(READY_URL_ENV)
    if base:
        return watches.UnloadProbe(base, name)

    def ask_the_stub() -> bool:
        try:
            return not pb_utils.is_model_ready(name)
        except pb_utils.TritonModelException as exc:
            # A stopping server answers "Server not ready" instead of the model's state; anything else is unknown.
            return "not ready" in str(exc)

    return ask_the_stub


class TritonStream:
    """A request's response sender, behind the poller's ResponseStream protocol."""

    __slots__ = ("_request", "_sender", "_forwarded", "_started", "_wanted")

    def __init__(self, request) -> None:
        self._request = request
        self._sender = request.get_response_sender()
        self._forwarded = request.request_id().startswith(FORWARDED_ID_PREFIX)
        self._started = False  # a response was sent
        # The outputs the client asked for (none named: all of them); Triton drops the others, so they are not built.
        wanted = request.requested_output_names()
        self._wanted = frozenset(wanted) if wanted else None

    def send(self, outputs: dict[str, np.ndarray] | None, final: bool) -> tuple[int, int]:
        """Send one response; returns (nanoseconds spent building Triton's tensors, tensors sent) for the timers."""
        flags = _FINAL if final else 0
        self._started = True
        if outputs is None:
            self._sender.send(flags=flags)
            return 0, 0
        started = time.perf_counter_ns()
        wanted = self._wanted
        tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items() if wanted is None or name in wanted]
        response = pb_utils.InferenceResponse(output_tensors=tensors)
        built = time.perf_counter_ns() - started
        self._sender.send(response, flags=flags)
        return built, len(tensors)

    def send_error(self, code: ErrorCode, message: str) -> None:
        response = pb_utils.InferenceResponse(error=triton_error(code, message))
        if self._forwarded and self._started:
            # A BLS caller (`tensorrt_llm_bls`) never receives an error response that follows earlier responses
            # (Triton 2.51's Python backend loses it, and the caller's iterator then waits forever, which holds
            # the server's stop until its exit timeout). A flag-only final arrives; the caller tells why.
            self._sender.send(flags=_FINAL)
            return
        self._sender.send(response, flags=_FINAL)

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()


class TritonMetricBackend:
    """metrics.MetricBackend on pb_utils.MetricFamily: one family per name, kept alive as long as the backend.

    Triton raises on any call to a metric whose MetricFamily was garbage-collected, so every metric returned here
    holds its family too.
    """

    def __init__(self) -> None:
        self._families: dict[str, object] = {}

    def counter(self, name: str, description: str, labels: dict[str, str]):
        return _TritonMetric(self._family(name, description, pb_utils.MetricFamily.COUNTER), labels)

    def gauge(self, name: str, description: str, labels: dict[str, str]):
        return _TritonMetric(self._family(name, description, pb_utils.MetricFamily.GAUGE), labels)

    def histogram(self, name: str, description: str, labels: dict[str, str], buckets):
        family = self._family(name, description, pb_utils.MetricFamily.HISTOGRAM)
        return _TritonMetric(family, labels, [float(b) for b in buckets])

    def close(self) -> None:
        """Let go of the families (the metrics made here must be gone already)."""
        self._families.clear()

    def _family(self, name: str, description: str, kind):
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = pb_utils.MetricFamily(name=name, description=description, kind=kind)
        return family


class _TritonMetric:
    __slots__ = ("_family", "_metric")

    def __init__(self, family, labels: dict[str, str], buckets: list[float] | None = None) -> None:
        self._family = family  # keeps the family alive as long as this metric
        self._metric = family.Metric(labels=labels) if buckets is None else family.Metric(labels=labels, buckets=buckets)

    def increment(self, value: float) -> None:
        self._metric.increment(value)

    def set(self, value: float) -> None:
        self._metric.set(value)

    def observe(self, value: float) -> None:
        self._metric.observe(value)
