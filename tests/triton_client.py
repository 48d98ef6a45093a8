"""Client helpers for the end-to-end tests: build NVIDIA-named inputs and collect streamed responses."""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import InferResult, service_pb2_grpc
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import np_to_triton_dtype

_DTYPES = {np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL", np.uint64: "UINT64", np.object_: "BYTES"}


def tensor(name: str, value, dtype) -> grpcclient.InferInput:
    array = np.asarray(value, dtype=dtype)
    if array.ndim == 0:
        array = array.reshape(1, 1)
    elif name in ("input_ids", "embedding_bias", "stop_words", "bad_words") and array.ndim == 1:
        array = array.reshape(1, -1)
    infer_input = grpcclient.InferInput(name, list(array.shape), _DTYPES[array.dtype.type])
    infer_input.set_data_from_numpy(array)
    return infer_input


def as_inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    """gRPC inputs from named arrays, each with its own shape and dtype (as NVIDIA's scripts build them)."""
    inputs = []
    for name, array in arrays.items():
        infer_input = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


def token_inputs(input_ids: list[int], max_tokens: int, streaming: bool = True, **extra) -> list[grpcclient.InferInput]:
    inputs = [
        tensor("input_ids", [input_ids], np.int32),
        tensor("request_output_len", max_tokens, np.int32),
        tensor("streaming", streaming, np.bool_),
    ]
    for name, (value, dtype) in extra.items():
        inputs.append(tensor(name, value, dtype))
    return inputs


def text_inputs(text: str, max_tokens: int, stream: bool = True, **extra) -> list[grpcclient.InferInput]:
    inputs = [
        tensor("text_input", [[text.encode()]], np.object_),
        tensor("max_tokens", max_tokens, np.int32),
        tensor("stream", stream, np.bool_),
    ]
    for name, (value, dtype) in extra.items():
        inputs.append(tensor(name, value, dtype))
    return inputs


_ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']+', ")


def model_error(message: str) -> str:
    """An error message as the model wrote it: a Triton ensemble puts "in ensemble '<name>', " before the message
    of the step that failed (the Triton error code is kept)."""
    return _ENSEMBLE_PREFIX.sub("", message, count=1)


@dataclass
class StreamResult:
    responses: list = field(default_factory=list)  # InferResult with outputs, in arrival order
    errors: list[str] = field(default_factory=list)  # error messages (an error response is always final)
    finals: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def tokens(self) -> list[int]:
        return [int(t) for r in self.responses for t in r.as_numpy("output_ids").reshape(-1)]

    def text(self) -> str:
        return "".join(r.as_numpy("text_output").reshape(-1)[0].decode() for r in self.responses)

    def wait(self, timeout_s: float = 60.0) -> StreamResult:
        assert self.done.wait(timeout_s), "no final response"
        return self


def wait_until_streaming(streams: list[StreamResult], timeout_s: float) -> None:
    """Return once every stream has had a response; assert that it happens within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not all(stream.responses for stream in streams):
        assert time.monotonic() < deadline, f"{sum(not s.responses for s in streams)} of {len(streams)} streams never started"
        time.sleep(0.05)


class StreamClient:
    """One bidirectional gRPC stream carrying many requests, on Triton's own gRPC service.

    tritonclient's stream callback drops the request id of error responses; here every response, error or not,
    lands on the request it answers.
    """

    def __init__(self, url: str) -> None:
        self.channel = grpc.insecure_channel(url)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.results: dict[str, StreamResult] = {}
        self.call_ended = threading.Event()  # the gRPC call itself ended (closed, cancelled, or the server went away)
        self.call_code: grpc.StatusCode | None = None  # how it ended, when the server ended it
        self._requests: queue.Queue = queue.Queue()
        self._call = self.stub.ModelStreamInfer(iter(self._requests.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self._call:
                response = message.infer_response
                target = self.results.get(response.id or _id_in_message(message.error_message))
                if target is None:
                    continue
                if message.error_message:
                    target.errors.append(message.error_message)
                    target.finals += 1
                    target.done.set()
                    continue
                final = response.parameters.get("triton_final_response")
                if response.outputs:
                    target.responses.append(InferResult(response))
                if final is not None and final.bool_param:
                    target.finals += 1
                    target.done.set()
        except grpc.RpcError as exc:  # stream closed or cancelled, or the server went away
            self.call_code = exc.code()
        finally:
            self.call_ended.set()

    def send(self, model: str, inputs, request_id: str, parameters: dict | None = None,
             outputs: list[str] | None = None) -> StreamResult:
        """`outputs`: the outputs to ask for (None: all)."""
        result = StreamResult()
        self.results[request_id] = result
        wanted = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
        request = _get_inference_request(model, inputs, "", request_id, wanted, 0, False, False, 0, None, parameters)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        self._requests.put(request)
        return result

    def cancel(self) -> None:
        """Cancel the whole gRPC call, as `stop_stream(cancel_requests=True)` does."""
        self._call.cancel()

    def close(self) -> None:
        """End the stream as a well-behaved client does once every request has its final response: half-close, wait
        for the server to end the call, then close the channel. A close with requests still open cancels them.
        (A channel closed as the server writes a last response can leave tritonserver 2.51 holding that request,
        and so its model, until it exits: the race `serve`'s stop handles, see held_by_triton_only.)"""
        self._requests.put(None)
        if all(result.done.is_set() for result in self.results.values()):
            self.call_ended.wait(10)
        self.channel.close()


def stream_once(url: str, model: str, inputs, timeout_s: float = 60.0, parameters: dict | None = None) -> StreamResult:
    client = StreamClient(url)
    try:
        return client.send(model, inputs, "only", parameters).wait(timeout_s)
    finally:
        client.close()


def _id_in_message(message: str) -> str:
    # Triton's own refusals (e.g. its queue) carry the id only in the message: "[request id: X] ...".
    match = re.match(r"\[request id: ([^\]]+)\]", message)
    return match.group(1) if match else ""
