"""The Triton side of the frontend: the models Triton serves, and one generation's request and its new tokens.

Per Triton URL: tritonclient's asyncio client (readiness, repository index, model configs) and one gRPC channel
for generations. Several URLs (replicas serving the same models) share the requests round-robin, skipping a Triton
that cannot be reached; one URL is the common case. A generation is one request on a `ModelStreamInfer` call
(tritonclient's generated stub, raw tensors), the call reused by later requests while it is fresh (see _Calls);
cancelling the call is how a client that went away cancels its request, as Triton passes the cancellation to the
model.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import struct
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ..executor_interface import Tokenizer
from ..server import ADMIN_KEY_ENV, admin_headers
from .protocol import ApiError
from .tokenization import config_parameters, context_length, llmapi_tokenizer_parameters, load_model_tokenizer

IDLE_CLOSE_S = 0.25
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
# Our model's finish_reason output -> OpenAI's.
FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "stop": "stop", "length": "length", "timeout": "length"}
# The engine's per-request KV-cache reuse, in blocks (NVIDIA's return_perf_metrics outputs): blocks -> cached tokens.
REUSED_BLOCKS_OUTPUTS = ("kv_cache_reused_blocks", "kv_cache_reused_block")
# The model's error text starts with the Triton error code, then the input it is about (see triton_io.py).
_ERROR = re.compile(r"^(?:\[request id: [^\]]*\] )?(?:(?P<code>[A-Z_]+): )?(?P<text>.*)$", re.S)
_FIELD = re.compile(r"^(?P<name>[a-z_]+)\b")
# The embedded engine's block size; NVIDIA's default tokens_per_block for TensorRT-LLM's engines.
EMBEDDED_TOKENS_PER_BLOCK, TRTLLM_TOKENS_PER_BLOCK = 16, 32
# The engines' words for a prompt (+ max_tokens) over what the model takes: OpenAI's context_length_exceeded.
_TOO_LONG = re.compile(r"^(input length \d+ (\+ max_tokens \d+ )?exceeds|input_ids: prompt of \d+ tokens is over|"
                       r"\w+=\d+: with the prompt's \d+ tokens that is \d+, over max_seq_len)")


@dataclass(slots=True)
class ModelInfo:
    name: str
    tokenizer: Tokenizer
    max_output_len: int | None
    context_length: int | None
    inputs: frozenset[str] = frozenset()  # the model's input names (optional ones are sent only if it has them)
    # NVIDIA's LLM API layout (text_input, sampling_param_*, cumulative text_output) rather than token ids.
    outputs: frozenset[str] = frozenset()
    text: bool = False
    decoupled: bool = True  # streams its responses; otherwise one response per request
    batched: bool = False  # max_batch_size > 0: every tensor has a leading batch dimension of 1
    tokens_per_block: int = EMBEDDED_TOKENS_PER_BLOCK  # to count reused KV blocks as cached prompt tokens
    executor: str = "transformers"  # the engine behind it (for /version)
    max_batch_size: int | None = None  # the sequences the engine runs at once, where its parameters say
    created: int = field(default_factory=lambda: int(time.time()))
    request_template: service_pb2.ModelInferRequest = field(init=False)  # what every request to it starts from

    def __post_init__(self) -> None:
        self.request_template = _request_template(self)


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
    top_logprobs: int = 0  # the likeliest tokens returned at each position (the embedded engine's num_top_log_probs)
    min_tokens: int | None = None
    guide_type: str | None = None  # NVIDIA's guided_decoding_guide_type / guided_decoding_guide
    guide: str | None = None
    # The model's input names -> the OpenAI parameter the caller used for it (for 400s naming the parameter).
    param_names: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Delta:
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str | None  # OpenAI's, on the last delta only
    text: str | None = None  # a text model's new text (token_ids then empty)
    top_log_probs: list[list[tuple[int, float]]] | None = None  # per token: the likeliest (id, log prob), best first


def _add_input(request: service_pb2.ModelInferRequest, name: str, datatype: str, shape: list[int], raw: bytes) -> None:
    tensor = request.inputs.add(name=name, datatype=datatype)
    tensor.shape.extend(shape)
    request.raw_input_contents.append(raw)


_TRUE = b"\x01"


def _request_template(info: ModelInfo) -> service_pb2.ModelInferRequest:
    """What every generation request to this model carries."""
    request = service_pb2.ModelInferRequest(model_name=info.name)
    # The end is Triton's `triton_final_response` flag, even on a final response with no outputs.
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    if info.text:
        return _text_request_template(info, request)
    _add_input(request, "streaming", "BOOL", [1, 1], _TRUE)
    if "return_finish_reason" in info.inputs:
        _add_input(request, "return_finish_reason", "BOOL", [1, 1], _TRUE)
    end_id = info.tokenizer.eos_token_id
    if end_id is not None:
        _add_input(request, "end_id", "INT32", [1, 1], struct.pack("<i", end_id))
    for name in ("output_ids", "finish_reason"):  # only what the frontend reads (log probs: added when asked)
        request.outputs.add(name=name)
    _ask_reused_blocks(request, info)
    return request


def _ask_reused_blocks(request: service_pb2.ModelInferRequest, info: ModelInfo) -> None:
    """The engine's count of this request's reused KV blocks (usage.prompt_tokens_details.cached_tokens)."""
    perf_input = "sampling_param_return_perf_metrics" if info.text else "return_perf_metrics"
    output = next((name for name in REUSED_BLOCKS_OUTPUTS if name in info.outputs), None)
    if perf_input in info.inputs and output is not None:
        _add_input(request, perf_input, "BOOL", _shape(info, 1) if info.text else [1, 1], _TRUE)
        request.outputs.add(name=output)


def _text_request_template(info: ModelInfo, request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferRequest:
    """NVIDIA's LLM API model: text in, the text so far out (without the prompt), its finish reason."""
    _add_input(request, "streaming", "BOOL", _shape(info, 1), _TRUE if info.decoupled else b"\x00")
    for name in ("return_finish_reason", "sampling_param_exclude_input_from_output"):
        if name in info.inputs:
            _add_input(request, name, "BOOL", _shape(info, 1), _TRUE)
    for name in ("text_output", "finish_reason"):
        request.outputs.add(name=name)
    _ask_reused_blocks(request, info)
    return request


def _shape(info: ModelInfo, size: int) -> list[int]:
    return [1, size] if info.batched else [size]


def _bytes_tensor(texts: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(raw)) + raw for raw in (text.encode() for text in texts))


def text_generation_request(request_id: str, info: ModelInfo, prompt: str,
                            sampling: Sampling) -> service_pb2.ModelInferRequest:
    """The LLM API model's inputs (text_input, sampling_param_*) for one generation."""
    # (log probs are refused before, with the layout named: app._sampling)
    unsupported = (("min_tokens", sampling.min_tokens), ("guided_decoding_guide_type", sampling.guide_type))
    for name, value in unsupported:
        if value:
            param = sampling.param_names.get(name, name)
            raise ApiError(400, f"{param}: not supported by model {info.name!r} (NVIDIA's LLM API inputs have no "
                           "such parameter)", param, "unsupported_parameter")
    request = service_pb2.ModelInferRequest()
    request.CopyFrom(info.request_template)
    request.id = request_id
    _add_input(request, "text_input", "BYTES", _shape(info, 1), _bytes_tensor([prompt]))
    _add_input(request, "sampling_param_max_tokens", "INT32", _shape(info, 1), struct.pack("<i", sampling.max_tokens))
    for name, value in (("temperature", sampling.temperature), ("top_p", sampling.top_p),
                        ("presence_penalty", sampling.presence_penalty),
                        ("frequency_penalty", sampling.frequency_penalty)):
        if value is not None:
            _add_input(request, f"sampling_param_{name}", "FP32", _shape(info, 1), struct.pack("<f", value))
    if sampling.seed is not None:
        _add_input(request, "sampling_param_seed", "UINT64", _shape(info, 1), struct.pack("<Q", sampling.seed))
    if sampling.stop_words:
        _add_input(request, "sampling_param_stop", "BYTES", _shape(info, len(sampling.stop_words)),
                   _bytes_tensor(sampling.stop_words))
    return request


def generation_request(request_id: str, info: ModelInfo, input_ids: list[int],
                       sampling: Sampling) -> service_pb2.ModelInferRequest:
    """The `tensorrt_llm` model's inputs (NVIDIA's names) for one streamed generation, as raw little-endian
    tensors (building them from numpy through tritonclient's InferInput cost more than the rest of the request)."""
    request = service_pb2.ModelInferRequest()
    request.CopyFrom(info.request_template)
    request.id = request_id
    _add_input(request, "input_ids", "INT32", [1, len(input_ids)], struct.pack(f"<{len(input_ids)}i", *input_ids))
    _add_input(request, "request_output_len", "INT32", [1, 1], struct.pack("<i", sampling.max_tokens))
    for name, value in (("temperature", sampling.temperature), ("top_p", sampling.top_p),
                        ("presence_penalty", sampling.presence_penalty),
                        ("frequency_penalty", sampling.frequency_penalty)):
        if value is not None:
            _add_input(request, name, "FP32", [1, 1], struct.pack("<f", value))
    if sampling.seed is not None:
        _add_input(request, "seed", "UINT64", [1, 1], struct.pack("<Q", sampling.seed))
    if sampling.min_tokens:
        _add_input(request, "min_tokens", "INT32", [1, 1], struct.pack("<i", sampling.min_tokens))
    if sampling.guide_type is not None:
        for name, text in (("guided_decoding_guide_type", sampling.guide_type), ("guided_decoding_guide", sampling.guide)):
            if text is not None:
                raw = text.encode()
                _add_input(request, name, "BYTES", [1, 1], struct.pack("<I", len(raw)) + raw)
    if sampling.stop_words:  # lets the engine stop early where a stop string is whole tokens; text_stream cuts
        words = [w.encode() for w in sampling.stop_words]
        _add_input(request, "stop_words", "BYTES", [1, len(words)],
                   b"".join(struct.pack("<I", len(w)) + w for w in words))
    if sampling.logprobs:
        _add_input(request, "return_log_probs", "BOOL", [1, 1], _TRUE)
        request.outputs.add(name="output_log_probs")
    if sampling.top_logprobs:
        if "num_top_log_probs" not in info.inputs or info.executor == "trtllm_engine":
            # TensorRT-LLM's executor API returns only the sampled token's log prob (OutputConfig has no top-k).
            param = sampling.param_names.get("num_top_log_probs", "top_logprobs")
            raise ApiError(400, f"{param}={sampling.top_logprobs}: model {info.name!r} (executor {info.executor}) "
                           "returns only the sampled token's log probability; the embedded engine and TensorRT-LLM's "
                           "LLM API (executor trtllm_llmapi) return the likeliest tokens' too", param,
                           "unsupported_value")
        _add_input(request, "num_top_log_probs", "INT32", [1, 1], struct.pack("<i", sampling.top_logprobs))
        request.outputs.add(name="output_top_log_prob_ids")
        request.outputs.add(name="output_top_log_probs")
    return request


def response_delta(response: service_pb2.ModelInferResponse, final: bool, top_logprobs: int = 0) -> Delta:
    """New tokens (and log probs, the likeliest tokens' with `top_logprobs`, finish reason) of one response; any
    output shape, read flat. A final response without a finish reason says "stop" (the caller knows better when
    the length ran out)."""
    ids, log_probs, reason, top_ids, top_values = [], None, None, None, None
    for index, output in enumerate(response.outputs):
        raw = response.raw_output_contents[index]
        if output.name == "output_ids":
            ids = [t for t in array("i", raw) if t >= 0]  # beams are padded with -1
        elif output.name == "output_log_probs":
            log_probs = array("f", raw).tolist()
        elif output.name == "finish_reason" and len(raw) >= 4:
            reason = _first_string(raw)
        elif output.name == "output_top_log_prob_ids":
            top_ids = array("i", raw).tolist()
        elif output.name == "output_top_log_probs":
            top_values = array("f", raw).tolist()
    finish = FINISH_REASONS.get(reason or "", "stop") if final else None
    top = None
    if top_logprobs and top_ids is not None and top_values is not None:
        # [1, 1, tokens, k], read flat: k a token; a position short of k allowed tokens is padded with id -1.
        top = [[(i, v) for i, v in zip(top_ids[start : start + top_logprobs], top_values[start : start + top_logprobs])
                if i >= 0] for start in range(0, len(top_ids), top_logprobs)]
    return Delta(ids, log_probs, finish, top_log_probs=top)


def _first_string(raw: bytes) -> str:
    """The first string of a BYTES tensor."""
    length = struct.unpack_from("<I", raw)[0]
    return raw[4 : 4 + length].decode()


def reused_blocks(response: service_pb2.ModelInferResponse) -> int | None:
    for index, output in enumerate(response.outputs):
        if output.name in REUSED_BLOCKS_OUTPUTS:
            raw = response.raw_output_contents[index]
            return struct.unpack_from("<i", raw)[0] if len(raw) >= 4 else None
    return None


def text_so_far(response: service_pb2.ModelInferResponse) -> tuple[str | None, str | None]:
    """A text model's response: (its text so far, its finish reason; None while it runs)."""
    text, reason = None, None
    for index, output in enumerate(response.outputs):
        raw = response.raw_output_contents[index]
        if output.name == "text_output" and len(raw) >= 4:
            text = _first_string(raw)
        elif output.name == "finish_reason" and len(raw) >= 4:
            reason = _first_string(raw)
    return text, None if reason in (None, "None") else reason


def api_error_from_triton(message: str, param_names: dict[str, str]) -> ApiError:
    """Triton's error text -> OpenAI's error with the status the issue asks for."""
    match = _ERROR.match(message)
    code, text = match.group("code"), match.group("text")
    if code == "INVALID_ARG" and _TOO_LONG.match(text):
        prompt = param_names.get("input_ids")
        # The prompt as the caller sent it (messages, prompt), not the model's input tensor.
        text = text.replace("input_ids: prompt", f"{prompt}: prompt", 1) if prompt else text
        return ApiError(400, text, prompt, "context_length_exceeded")
    if code in ("INVALID_ARG", "UNSUPPORTED"):
        name = _FIELD.match(text)
        param = param_names.get(name.group("name")) if name else None
        if param and name.group("name") != param:
            # Named as the caller knows it ("max_tokens=4097: ...", not the tensor's request_output_len=4097).
            rest = text[name.end() :]
            text = f"{param}{rest}" if rest.startswith("=") else f"{param}: {text}"
        return ApiError(400, text, param, code.lower())
    if code == "UNAVAILABLE" and text.startswith("queue full"):
        return ApiError(429, text, None, "queue_full")
    if code == "UNAVAILABLE" or "unknown model" in message or "not ready" in message:
        return ApiError(503, text, None, "model_not_ready")
    return ApiError(500, message, None, "triton_error")


class _Calls:
    """Open `ModelStreamInfer` calls to one Triton, each carrying one request at a time and reused by the next.

    A request on an open call reached its first token ~0.5 ms sooner than on a new call; one request per call
    keeps concurrent streams as fast as separate calls (sharing one call among many requests cost a third of the
    tokens/s at 64 streams; bench/openai.py), and cancelling the call is how a request is cancelled. A call left
    unused for IDLE_CLOSE_S is closed: an open call, even idle, keeps tritonserver 2.51 from unloading the model it
    last served and from exiting until its exit timeout."""

    def __init__(self, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
        self._stub = stub
        self._idle: list[tuple[grpc.aio.StreamStreamCall, asyncio.TimerHandle]] = []

    def take(self) -> grpc.aio.StreamStreamCall:
        while self._idle:
            call, timer = self._idle.pop()
            timer.cancel()
            if not call.done():  # not ended by Triton (e.g. restarted) while idle
                return call
        return self._stub.ModelStreamInfer()

    def give_back(self, call: grpc.aio.StreamStreamCall) -> None:
        timer = asyncio.get_running_loop().call_later(IDLE_CLOSE_S, self._close_idle, call)
        self._idle.append((call, timer))

    def _close_idle(self, call: grpc.aio.StreamStreamCall) -> None:
        self._idle = [(c, t) for c, t in self._idle if c is not call]
        call.cancel()  # it carries no request: nothing in Triton is cancelled

    def close(self) -> None:
        for call, timer in self._idle:
            timer.cancel()
            call.cancel()
        self._idle.clear()


class TritonPool:
    def __init__(self, urls: list[str], executor: str | None = None, model_repository: str | None = None) -> None:
        if not urls:
            raise ValueError("at least one Triton gRPC URL is needed")
        self.urls = urls
        self.executor = executor  # the executor the server was started with, when it overrides the config's
        self.model_repository = model_repository  # where an LLM API model's model.yaml (its tokenizer) is read
        # tritonclient's asyncio client for readiness and the repository; generations on a channel of their own
        # through tritonclient's generated stub, with raw tensors.
        self._clients = [grpcaio.InferenceServerClient(url) for url in urls]
        self._channels = [grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS) for url in urls]
        self._stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in self._channels]
        self._calls = [_Calls(stub) for stub in self._stubs]
        self._turn = itertools.cycle(range(len(urls)))
        # Triton request ids: unique per frontend process, cheaper than a uuid per request.
        self._id_prefix, self._ids = f"openai-{uuid.uuid4().hex[:12]}-", itertools.count()
        self.models: dict[str, ModelInfo] = {}
        self._refresh_lock = asyncio.Lock()

    async def close(self) -> None:
        for calls in self._calls:
            calls.close()
        for client in self._clients:
            await client.close()
        for channel in self._channels:
            await channel.close()

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
            states = await self._model_states()
            for name in [n for n in self.models if states.get(n) != "READY"]:
                del self.models[name]
            for name, state in states.items():
                if state == "READY" and name not in self.models:
                    config = (await self._first_answer(lambda c, n=name: c.get_model_config(n, as_json=True)))["config"]
                    if _generates(config):
                        self.models[name] = await asyncio.to_thread(self._model_info, name, config)
            return states

    async def _model_states(self) -> dict[str, str]:
        """Every model's state: READY or not. With the repository at hand, its model folders' readiness (open to
        every client: the frontend that `serve` starts holds no admin key); else the repository index, which is
        restricted to the admin key (docs/security.md): a standalone frontend reads it from its environment."""
        if self.model_repository:
            names = sorted(config.parent.name for config in Path(self.model_repository).glob("*/config.pbtxt"))
            ready = await asyncio.gather(*(self._first_answer(lambda c, n=name: c.is_model_ready(n)) for name in names))
            return {name: "READY" if is_ready else "UNAVAILABLE" for name, is_ready in zip(names, ready, strict=True)}
        key = os.environ.get(ADMIN_KEY_ENV)
        headers = admin_headers(key) if key else None
        index = await self._first_answer(lambda c: c.get_model_repository_index(headers=headers, as_json=True))
        return {m["name"]: m.get("state", "") for m in index.get("models", [])}

    def _model_info(self, name: str, config: dict) -> ModelInfo:
        parameters = config_parameters(config)
        text = _generates(config) == "text"
        llm_api = llmapi_tokenizer_parameters(self.model_repository, name) if text else None
        if llm_api is not None:
            parameters = {**llm_api[0], **parameters}
        executor = self.executor or (llm_api[1] if llm_api else None)
        tokenizer = load_model_tokenizer(parameters, executor)
        if tokenizer is None:
            raise ApiError(503, f"model {name}: no tokenizer known (set its tokenizer_dir parameter)", None,
                           "no_tokenizer")
        max_output = parameters.get("max_output_len")
        batch = parameters.get("max_batch_size")
        block = parameters.get("tokens_per_block")
        executor = executor or parameters.get("executor") or "transformers"
        default_block = EMBEDDED_TOKENS_PER_BLOCK if executor in ("transformers", "synthetic") else TRTLLM_TOKENS_PER_BLOCK
        return ModelInfo(name, tokenizer, int(max_output) if max_output else None, context_length(tokenizer),
                         frozenset(i["name"] for i in config.get("input", [])), text=text,
                         decoupled=config.get("model_transaction_policy", {}).get("decoupled", False),
                         batched=int(config.get("max_batch_size", 0) or 0) > 0,
                         tokens_per_block=int(block) if block else default_block,
                         outputs=frozenset(o["name"] for o in config.get("output", [])), executor=executor,
                         max_batch_size=int(batch) if str(batch or "").isdigit() and int(batch) > 0 else None)

    async def server_version(self) -> str:
        """Triton's version, as its server metadata says."""
        return (await self._first_answer(lambda c: c.get_server_metadata(as_json=True))).get("version", "")

    async def model(self, name: str) -> ModelInfo:
        info = self.models.get(name)
        if info is not None:
            return info
        states = await self.refresh_models()
        if name in self.models:
            return self.models[name]
        if states.get(name) == "READY":
            raise ApiError(404, f"The model {name!r} is served by Triton but is not a text generation model this API "
                           "can drive (token ids or NVIDIA's LLM API inputs); GET /v1/models lists those", "model",
                           "model_not_found")
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

    async def send(self, info: ModelInfo, input_ids: list[int], sampling: Sampling) -> TritonGeneration:
        """The request, sent to the next Triton in turn (one that cannot be reached is skipped for the next). Returns
        as soon as it is written, so the caller prepares its response while the model works."""
        request_id = f"{self._id_prefix}{next(self._ids)}"
        if info.text:  # the prompt as text: the chat template's rendering, special tokens included
            prompt = info.tokenizer.decode(input_ids, skip_special_tokens=False)
            request = text_generation_request(request_id, info, prompt, sampling)
        else:
            request = generation_request(request_id, info, input_ids, sampling)
        failure: grpc.RpcError | None = None
        for _ in range(len(self._calls)):
            calls = self._calls[next(self._turn)]
            call = calls.take()
            try:
                await call.write(request)
                return TritonGeneration(calls, call, sampling, info)
            except grpc.RpcError as exc:
                call.cancel()
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise _call_failed(exc) from None
                failure = exc  # no connection to that Triton: the request never started there
            except BaseException:
                call.cancel()  # the client went away while its request was sent
                raise
        raise _call_failed(failure)


class TritonGeneration:
    """One request on its `ModelStreamInfer` call: `next_delta()` until a delta has a finish reason, then
    `close()`. Closed before its final response, the call is cancelled, and Triton cancels the request."""

    def __init__(self, calls: _Calls, call: grpc.aio.StreamStreamCall, sampling: Sampling, info: ModelInfo) -> None:
        self._calls, self._call, self._sampling, self._info = calls, call, sampling, info
        self._generated = 0
        self._text = ""  # a text model's text so far
        self.cached_tokens = 0  # prompt tokens the engine found in its KV cache (reused blocks)
        self._done = False  # the final (or an error) response came: the call carries no request now
        self._closed = False

    async def next_delta(self) -> Delta:
        """The next response's new tokens; raises ApiError for a Triton error."""
        try:
            message = await self._call.read()
        except grpc.RpcError as exc:
            raise _call_failed(exc) from None
        if message is grpc.aio.EOF:
            raise ApiError(503, "Triton ended the call before the final response", None, "triton_unavailable")
        if message.error_message:
            self._done = True  # an error response is the request's last
            raise api_error_from_triton(message.error_message, self._sampling.param_names)
        response = message.infer_response
        final_flag = response.parameters.get("triton_final_response")
        final = final_flag is not None and final_flag.bool_param
        blocks = reused_blocks(response)
        if blocks:
            self.cached_tokens = blocks * self._info.tokens_per_block
        if self._info.text:
            return self._text_delta(response, final)
        delta = response_delta(response, final, self._sampling.top_logprobs)
        self._generated += len(delta.token_ids)
        if final and not _has_output(response, "finish_reason"):
            delta.finish_reason = "length" if self._generated >= self._sampling.max_tokens else "stop"
        self._done = final
        return delta

    def _text_delta(self, response: service_pb2.ModelInferResponse, final: bool) -> Delta:
        text, reason = text_so_far(response)
        new = ""
        if text is not None:
            # Streamed, the text so far (cumulative, as the LLM API's); unary, all of it at once.
            new = text[len(self._text) :] if text.startswith(self._text) else text
            self._text = text
        self._done = final
        return Delta([], None, FINISH_REASONS.get(reason or "", "stop") if final else None, new)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._done:
            self._calls.give_back(self._call)
        else:
            self._call.cancel()  # the client went away (or the call broke): Triton cancels the request


def _call_failed(error: grpc.RpcError) -> ApiError:
    return ApiError(503, f"Triton call failed: {error.details()}", None, "triton_unavailable")


def _has_output(response: service_pb2.ModelInferResponse, name: str) -> bool:
    return any(output.name == name for output in response.outputs)


def _generates(config: dict) -> str | None:
    """"tokens": a decoupled model with NVIDIA's token-level names (our `tensorrt_llm`); "text": NVIDIA's LLM API
    model (text_input, sampling_param_*; decoupled or not); None: neither (the ensemble, BLS, pre/postprocessing)."""
    inputs = {i["name"] for i in config.get("input", [])}
    outputs = {o["name"] for o in config.get("output", [])}
    decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
    if decoupled and {"input_ids", "request_output_len"} <= inputs and "output_ids" in outputs:
        return "tokens"
    if {"text_input", "sampling_param_max_tokens"} <= inputs and "text_output" in outputs:
        return "text"
    return None
