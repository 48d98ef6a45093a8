"""The Triton side of the frontend: tritonclient's asyncio gRPC clients (one channel per Triton URL), the models
they serve, and one generation as an async iterator of new tokens.

Several URLs (replicas serving the same models) share the requests round-robin; one URL is the common case.
Each generation is its own bidirectional `ModelStreamInfer` call carrying one request, so closing the call is
how a client that went away cancels its request (Triton passes the cancellation to the model).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from ..executor_interface import Tokenizer
from .protocol import ApiError
from .tokenization import config_parameters, context_length, load_model_tokenizer

# Our model's finish_reason output -> OpenAI's.
FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "length": "length", "timeout": "length"}
# The model's error text starts with the Triton error code, then the input it is about (see triton_io.py).
_ERROR = re.compile(r"^(?:\[request id: [^\]]*\] )?(?:(?P<code>[A-Z_]+): )?(?P<text>.*)$", re.S)
_FIELD = re.compile(r"^(?P<name>[a-z_]+)\b")


@dataclass(slots=True)
class ModelInfo:
    name: str
    tokenizer: Tokenizer
    max_output_len: int | None
    context_length: int | None
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(slots=True)
class Sampling:
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop_words: list[str] = field(default_factory=list)
    logprobs: bool = False
    # The model's input names -> the OpenAI parameter the caller used for it (for 400s naming the parameter).
    param_names: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Delta:
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str | None  # OpenAI's, on the last delta only


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def request_inputs(input_ids: list[int], sampling: Sampling, end_id: int | None) -> list[grpcclient.InferInput]:
    """The `tensorrt_llm` model's inputs (NVIDIA's names) for one streamed generation."""
    inputs = [
        _tensor("input_ids", np.array([input_ids], dtype=np.int32), "INT32"),
        _tensor("request_output_len", np.array([[sampling.max_tokens]], dtype=np.int32), "INT32"),
        _tensor("streaming", np.array([[True]]), "BOOL"),
        _tensor("return_finish_reason", np.array([[True]]), "BOOL"),  # the final response then carries outputs
    ]
    if end_id is not None:
        inputs.append(_tensor("end_id", np.array([[end_id]], dtype=np.int32), "INT32"))
    for name, value in (("temperature", sampling.temperature), ("top_p", sampling.top_p),
                        ("presence_penalty", sampling.presence_penalty),
                        ("frequency_penalty", sampling.frequency_penalty)):
        if value is not None:
            inputs.append(_tensor(name, np.array([[value]], dtype=np.float32), "FP32"))
    if sampling.seed is not None:
        inputs.append(_tensor("seed", np.array([[sampling.seed]], dtype=np.uint64), "UINT64"))
    if sampling.stop_words:  # lets the engine stop early where a stop string is whole tokens; text_stream cuts
        words = np.array([[w.encode() for w in sampling.stop_words]], dtype=np.object_)
        inputs.append(_tensor("stop_words", words, "BYTES"))
    if sampling.logprobs:
        inputs.append(_tensor("return_log_probs", np.array([[True]]), "BOOL"))
    return inputs


def api_error_from_triton(message: str, param_names: dict[str, str]) -> ApiError:
    """Triton's error text -> OpenAI's error with the status the issue asks for."""
    match = _ERROR.match(message)
    code, text = match.group("code"), match.group("text")
    if code in ("INVALID_ARG", "UNSUPPORTED"):
        name = _FIELD.match(text)
        param = param_names.get(name.group("name")) if name else None
        if param and name.group("name") != param:
            text = f"{param}: {text}"  # named as the caller knows it, Triton's own words after
        return ApiError(400, text, param, code.lower())
    if code == "UNAVAILABLE" and text.startswith("queue full"):
        return ApiError(429, text, None, "queue_full")
    if code == "UNAVAILABLE" or "unknown model" in message or "not ready" in message:
        return ApiError(503, text, None, "model_not_ready")
    return ApiError(500, message, None, "triton_error")


def _flat(result: grpcclient.InferResult, name: str) -> np.ndarray | None:
    array = result.as_numpy(name)
    return None if array is None else array.reshape(-1)


class TritonPool:
    def __init__(self, urls: list[str], executor: str | None = None) -> None:
        if not urls:
            raise ValueError("at least one Triton gRPC URL is needed")
        self.urls = urls
        self.executor = executor  # the executor the server was started with, when it overrides the config's
        self._clients = [grpcaio.InferenceServerClient(url) for url in urls]
        self._turn = itertools.cycle(range(len(self._clients)))
        self.models: dict[str, ModelInfo] = {}
        self._refresh_lock = asyncio.Lock()

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

    async def is_ready(self) -> bool:
        """Whether some Triton behind the frontend is ready (live, its models loaded)."""
        for client in self._clients:
            try:
                if await client.is_server_ready(client_timeout=2):
                    return True
            except (InferenceServerException, grpc.RpcError):
                continue
        return False

    async def refresh_models(self) -> dict[str, str]:
        """Learn the ready models that take token ids and stream token ids; returns every model's state."""
        async with self._refresh_lock:
            index = await self._first_answer(lambda c: c.get_model_repository_index(as_json=True))
            states = {m["name"]: m.get("state", "") for m in index.get("models", [])}
            for name in [n for n in self.models if states.get(n) != "READY"]:
                del self.models[name]
            for name, state in states.items():
                if state == "READY" and name not in self.models:
                    config = (await self._first_answer(lambda c, n=name: c.get_model_config(n, as_json=True)))["config"]
                    if _streams_tokens(config):
                        self.models[name] = await asyncio.to_thread(self._model_info, name, config)
            return states

    def _model_info(self, name: str, config: dict) -> ModelInfo:
        parameters = config_parameters(config)
        tokenizer = load_model_tokenizer(parameters, self.executor)
        if tokenizer is None:
            raise ApiError(503, f"model {name}: no tokenizer known (set its tokenizer_dir parameter)", None,
                           "no_tokenizer")
        max_output = parameters.get("max_output_len")
        return ModelInfo(name, tokenizer, int(max_output) if max_output else None, context_length(tokenizer))

    async def model(self, name: str) -> ModelInfo:
        info = self.models.get(name)
        if info is not None:
            return info
        states = await self.refresh_models()
        if name in self.models:
            return self.models[name]
        if name in states:
            raise ApiError(503, f"model {name!r} is not ready ({states[name] or 'unknown state'})", "model",
                           "model_not_ready")
        raise ApiError(404, f"The model {name!r} does not exist (GET /v1/models lists the models served)", "model",
                       "model_not_found")

    async def _first_answer(self, call):
        failure = None
        for client in self._clients:
            try:
                return await call(client)
            except (InferenceServerException, grpc.RpcError) as exc:
                failure = exc
        raise ApiError(503, f"Triton is not reachable at {', '.join(self.urls)}: {failure}", None, "triton_unavailable")

    async def generate(self, info: ModelInfo, input_ids: list[int], sampling: Sampling) -> AsyncIterator[Delta]:
        """The generation's new tokens as they stream; raises ApiError for a Triton error. Closing the iterator
        before the last delta cancels the request in Triton."""
        inputs = request_inputs(input_ids, sampling, info.tokenizer.eos_token_id)
        finished = asyncio.Event()

        async def requests():
            yield {"model_name": info.name, "inputs": inputs, "request_id": uuid.uuid4().hex}
            await finished.wait()  # keep the call open until the final response (closing it cancels)

        responses = self._clients[next(self._turn)].stream_infer(requests())
        done = False
        try:
            async for result, error in responses:
                if error is not None:
                    done = True
                    raise api_error_from_triton(error.message(), sampling.param_names)
                ids = _flat(result, "output_ids")
                log_probs = _flat(result, "output_log_probs") if sampling.logprobs else None
                reason = _flat(result, "finish_reason")
                final = result.get_response().parameters["triton_final_response"].bool_param
                finish = None
                if final:
                    done = True
                    raw = reason[0].decode() if reason is not None and reason.size else ""
                    finish = FINISH_REASONS.get(raw, "stop")
                yield Delta([] if ids is None else [t for t in ids.tolist() if t >= 0],
                            None if log_probs is None else log_probs.tolist(), finish)
                if final:
                    return
            done = True
            raise ApiError(503, "Triton closed the stream before the final response", None, "triton_unavailable")
        except grpc.RpcError as exc:
            done = True
            raise ApiError(503, f"Triton call failed: {exc.details() if hasattr(exc, 'details') else exc}", None,
                           "triton_unavailable") from None
        finally:
            finished.set()
            if not done:
                responses.cancel()


def _streams_tokens(config: dict) -> bool:
    """A decoupled model with NVIDIA's token-level names: our `tensorrt_llm` (the ensemble is text-only)."""
    inputs = {i["name"] for i in config.get("input", [])}
    outputs = {o["name"] for o in config.get("output", [])}
    decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
    return decoupled and {"input_ids", "request_output_len"} <= inputs and {"output_ids", "finish_reason"} <= outputs
