"""The HTTP side, served by uvicorn: FastAPI for /v1/models, /health and the lifespan (Triton clients, tokenizers);
/v1/chat/completions and /v1/completions as plain ASGI in front of it, on Starlette's Request and JSONResponse.

A generation's first Triton response is awaited before the HTTP status is chosen, so a request Triton refuses
(bad parameter, queue full, model unloading) gets its own status even with stream=true; errors after the first
token arrive as an SSE `error` event, which the `openai` client raises.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .generation import Choice, Generation, gather_all
from .protocol import ApiError, ChatRequest, CompletionRequest, parse_body
from .text_stream import TextStream
from .tokenization import chat_prompt_ids
from .tools import ToolCallText, conversation, guide_of, mode, tools_system_text
from .triton_pool import ModelInfo, Sampling, TritonPool

log = logging.getLogger("trtllm_model.openai")
access_log = logging.getLogger("trtllm_model.openai.access")

DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB: a 128k-token context as token ids is about 1 MiB of JSON
# Prompts up to this many characters are tokenized on the event loop (at most ~0.3 ms of SmolLM2's encode and chat
# template on the 2-core machine); longer ones in a worker thread, which costs ~0.09 ms of handoff.
INLINE_TOKENIZE_CHARS = 1024
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


# The most choices (n) a request may ask for where the model's max_batch_size is not known: OpenAI's bound.
MAX_CHOICES = 128

# The model `--served-model-name` renames: the one that runs the engine.
SERVED_MODEL = "tensorrt_llm"


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _sampling(request: ChatRequest | CompletionRequest, info: ModelInfo, prompt_tokens: int) -> Sampling:
    limit, limit_name = request.output_limit()
    if limit is not None and info.max_output_len is not None and limit > info.max_output_len:
        raise ApiError(400, f"{limit_name}={limit}: must be at most {info.max_output_len} (the model's "
                       "max_output_len)", limit_name, "invalid_value")
    if limit is None:  # OpenAI's default: as long as the model allows
        room = info.context_length - prompt_tokens if info.context_length else None
        candidates = [n for n in (info.max_output_len, room) if n is not None]
        limit = max(1, min(candidates)) if candidates else 16
    prompt_name = "messages" if isinstance(request, ChatRequest) else "prompt"
    logprobs, top_logprobs, top_name = _logprobs_asked(request, info)
    guide = guide_of(request) if isinstance(request, ChatRequest) else None
    # The model samples only when top_p or top_k is set (NVIDIA's reading; otherwise greedy), so a request with a
    # temperature above 0 carries top_p (OpenAI's default 1). Without temperature or top_p the model's default
    # applies, greedy, where OpenAI's own API would sample at temperature 1: a small model answers far better so.
    # top_p 0 keeps only the likeliest token: greedy.
    sampled = (request.top_p is not None or (request.temperature or 0.0) > 0.0) and request.top_p != 0
    # vLLM's ignore_eos: no end before max_tokens, which min_tokens says (the end token is banned until then).
    min_tokens = limit if request.ignore_eos else request.min_tokens
    return Sampling(
        max_tokens=limit,
        temperature=request.temperature if request.top_p != 0 else None,
        top_p=(1.0 if request.top_p is None else request.top_p) if sampled and request.temperature != 0 else None,
        seed=request.seed,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        stop_words=request.stop_strings(),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        min_tokens=min(min_tokens, limit) if min_tokens else None,
        guide_type=guide.type if guide else None,
        guide=guide.guide if guide else None,
        param_names=_PARAM_NAMES[limit_name, prompt_name, guide.param if guide else None,
                                 "ignore_eos" if request.ignore_eos else "min_tokens", top_name],
    )


def _logprobs_asked(request: ChatRequest | CompletionRequest, info: ModelInfo) -> tuple[bool, int, str]:
    """(log probs asked, alternatives per token, the parameter that asks for those). The layout is checked first,
    so a model that returns no log probabilities says so whichever of the two parameters came."""
    if isinstance(request, ChatRequest):
        logprobs, top, top_name = request.logprobs, request.top_logprobs or 0, "top_logprobs"
    else:
        logprobs, top, top_name = request.logprobs is not None, request.logprobs or 0, "logprobs"
    if info.text and (logprobs or top):
        param = top_name if top else "logprobs"
        raise ApiError(400, f"{param}: not supported by model {info.name!r}: NVIDIA's LLM API inputs (text_input, "
                       "sampling_param_*) return no log probabilities; the token-level model (trtllm-triton serve's "
                       "default layout) returns them", param, "unsupported_parameter")
    if top and not logprobs:
        raise ApiError(400, f"{top_name}: requires logprobs=true", top_name, "invalid_value")
    return logprobs, top, top_name


def _check_choices(request: ChatRequest | CompletionRequest, info: ModelInfo) -> None:
    """n is bounded by the sequences the engine runs at once (its max_batch_size; else OpenAI's 128): the choices
    are that many requests of the one prompt, which share its cached KV blocks only while they run together."""
    bound = info.max_batch_size or MAX_CHOICES
    if request.n > bound:
        why = "the sequences the model runs at once, its max_batch_size" if info.max_batch_size else "OpenAI's bound"
        raise ApiError(400, f"n={request.n}: at most {bound} choices per request ({why})", "n", "invalid_value")


def _param_names(limit_name: str, prompt_name: str, guide_name: str | None, min_tokens_name: str,
                 top_name: str) -> dict[str, str]:
    """The model's input names -> the OpenAI parameter a request gave it under."""
    names = {
        "request_output_len": limit_name, "max_tokens": limit_name, "temperature": "temperature",
        "top_p": "top_p", "runtime_top_p": "top_p", "seed": "seed", "random_seed": "seed",
        "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
        "stop_words": "stop", "input_ids": prompt_name, "input": prompt_name, "min_tokens": min_tokens_name,
        "logprobs": "logprobs", "text_input": prompt_name, "sampling_param_max_tokens": limit_name,
        "sampling_param_stop": "stop", "sampling_param_seed": "seed", "num_top_log_probs": top_name,
    }
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):  # NVIDIA's LLM API names
        names[f"sampling_param_{name}"] = name
    if guide_name is not None:
        names["guided_decoding_guide"] = names["guided_decoding_guide_type"] = guide_name
    return names


_PARAM_NAMES = {(limit, prompt, guide, min_tokens, top): _param_names(limit, prompt, guide, min_tokens, top)
                for limit in ("max_tokens", "max_completion_tokens") for prompt in ("messages", "prompt")
                for guide in (None, "response_format", "tools") for min_tokens in ("min_tokens", "ignore_eos")
                for top in ("top_logprobs", "logprobs")}


def _chat_ids(tokenizer, conversation: list[dict], tools: list[dict] | None, tools_text: str) -> list[int]:
    try:
        return chat_prompt_ids(tokenizer, conversation, tools, tools_text)
    except Exception as exc:  # the model's template refuses this conversation (e.g. roles out of order)
        raise ApiError(400, f"messages: the model's chat template refused them: {exc}", "messages",
                       "invalid_value") from None


async def prompt_ids(request: ChatRequest | CompletionRequest, info: ModelInfo) -> list[int]:
    """The prompt as token ids; a long text is tokenized in a worker thread, so the event loop keeps serving every
    other connection meanwhile."""
    tokenizer = info.tokenizer
    encode: Callable[[], list[int]]
    if isinstance(request, ChatRequest):
        messages = conversation(request)
        chars = sum(len(message["content"]) for message in messages)
        tools, tools_text = None, ""
        if request.tools:
            tools = [tool.model_dump(exclude_none=True) for tool in request.tools]
            tools_text = tools_system_text(request.tools)
            chars += len(tools_text)
        encode = functools.partial(_chat_ids, tokenizer, messages, tools, tools_text)
    else:
        prompt = request.single_prompt()
        if not isinstance(prompt, str):
            return prompt
        chars = len(prompt)
        encode = functools.partial(tokenizer.encode, prompt)
    if chars <= INLINE_TOKENIZE_CHARS:
        return encode()
    return await asyncio.to_thread(encode)


def _choice_sampling(sampling: Sampling, index: int) -> Sampling:
    """Choice `index`'s sampling: a seed given, each choice draws from its own (seed + index, as vLLM's n), so the
    choices differ and the request repeats exactly."""
    if index == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + index) % 2**64)


COMPLETION_ROUTES = {"/v1/chat/completions": (ChatRequest, "chatcmpl"), "/v1/completions": (CompletionRequest, "cmpl")}


class SseResponse:
    """A text/event-stream response sent as its events come; stopped (and so its Triton request cancelled) when
    the client goes away, even while it waits for the next token."""

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        try:
            # The first event is ready (the first token came before the status was chosen): it leaves right behind
            # the headers, before the tasks that watch the connection are even started.
            first = await anext(self.events)
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await send({"type": "http.response.body", "body": first, "more_body": True})

            async def send_all() -> None:
                async for event in self.events:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})

            with contextlib.suppress(ApiError, OSError):  # the client went away: nothing left to tell it
                await until_disconnected(receive, send_all())
        finally:
            await self.events.aclose()  # however it ended: an unfinished Triton request is cancelled


def _body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over {limit} bytes (trtllm-triton openai --max-body-bytes)", None,
                    "request_too_large")


async def request_body(scope, receive, limit: int) -> bytes:
    """The whole request body, straight from the ASGI messages; ApiError(413) as soon as it is known to be over
    `limit` bytes: from its Content-Length before any of it is read, or (chunked) from the bytes read so far."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise _body_too_large(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(499, "the client closed the connection", None, "client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def until_disconnected(receive, work):
    """`work`'s result; cancelled (and so its Triton request) if the client goes away first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # its cleanup cancels the Triton request
    if task.cancelled():
        raise ApiError(499, "the client closed the connection", None, "client_closed")
    return task.result()


def engine_version(executor: str) -> dict:
    """The engine behind an executor and its library's version (None where this process cannot tell)."""
    from importlib.metadata import PackageNotFoundError, version

    library = {"transformers": "transformers", "trtllm_engine": "tensorrt_llm",
               "trtllm_llmapi": "tensorrt_llm"}.get(executor)
    try:
        found = version(library) if library else None
    except PackageNotFoundError:
        found = None
    return {"executor": executor, "library": library, "version": found}


def create_app(urls: list[str], executor: str | None = None, banner: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, model_repository: str | None = None,
               log_access: bool = True, served_model_name: str | None = None):
    """The ASGI application: the completion endpoints first, then FastAPI for the rest (and the lifespan). With
    `served_model_name`, the token-level model is known by that name alone (vLLM's --served-model-name)."""
    pool: TritonPool  # made in the server's event loop: a grpc.aio channel belongs to the loop it was made in
    counters = FrontendCounters()

    def public_name(name: str) -> str:
        return served_model_name if served_model_name and name == SERVED_MODEL else name

    async def served_model(name: str) -> ModelInfo:
        """The model a request names, by its public name."""
        if served_model_name and name in (served_model_name, SERVED_MODEL):
            if name == served_model_name:
                return await pool.model(SERVED_MODEL)
            raise ApiError(404, f"The model {name!r} does not exist (GET /v1/models lists the models served)",
                           "model", "model_not_found")
        return await pool.model(name)

    def model_card(info: ModelInfo) -> dict:
        return {"id": public_name(info.name), "object": "model", "created": info.created, "owned_by": "trtllm-triton",
                "max_model_len": info.context_length}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        nonlocal pool
        pool = TritonPool(urls, executor, model_repository)
        try:
            await pool.refresh_models()  # load the tokenizers now, not on the first request
        except ApiError as exc:
            log.warning("no models yet (%s); they are looked up on first use", exc.message)
        gc.freeze()  # what startup made (modules, tokenizers) stays out of the collections during requests
        if banner:
            print(banner, flush=True)
        yield
        await pool.close()
        # Frozen objects are never collected, not even by the interpreter's last collection at exit: the modules'
        # reference cycles would outlive it, and a nanobind extension among them (triton's, which torch imports)
        # prints each of its objects as a leak.
        gc.unfreeze()

    app = FastAPI(title="trtllm-triton OpenAI-compatible API", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return _error_response(error)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", None, "internal_error"))

    @app.get("/health")
    async def health() -> Response:
        if await pool.is_ready():
            return JSONResponse({"status": "ok"})
        return _error_response(ApiError(503, "Triton is not ready", None, "not_ready"))

    @app.get("/v1/models")
    async def list_models() -> dict:
        await pool.refresh_models()
        return {"object": "list", "data": [model_card(info) for info in pool.models.values()]}

    @app.get("/v1/models/{name}")
    async def get_model(name: str) -> dict:
        return model_card(await served_model(name))

    @app.get("/version")
    async def versions() -> dict:
        """This project's, Triton's and the served model's engine's versions."""
        from .. import package_version

        await pool.refresh_models()
        info = pool.models.get(SERVED_MODEL) or next(iter(pool.models.values()), None)
        return {"version": package_version(), "triton": await pool.server_version(),
                "engine": engine_version(info.executor) if info else None}

    async def complete(scope, receive, record: AccessRecord, kind: type[ChatRequest] | type[CompletionRequest],
                       prefix: str) -> Response | SseResponse:
        request = parse_body(await request_body(scope, receive, max_body_bytes), kind)
        info = await served_model(request.model)
        _check_choices(request, info)
        input_ids = await prompt_ids(request, info)
        sampling = _sampling(request, info, len(input_ids))
        generation = Generation(
            id=f"{prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=request.model,
            prompt_tokens=len(input_ids),
            chat=kind is ChatRequest,
            include_usage=request.include_usage,
            continuous_usage=request.continuous_usage,
            top_logprobs=sampling.top_logprobs,
        )
        record.generation = generation
        calls = kind is ChatRequest and mode(request) != "none"

        async def send(index: int) -> Choice:
            """Choice `index`'s request, sent; made while the model works on it, not after its first token."""
            choice = Choice(index, TextStream(info.tokenizer, sampling.stop_words, sampling.logprobs),
                            await pool.send(info, input_ids, _choice_sampling(sampling, index)))
            generation.choices.append(choice)
            if calls:
                choice.calls = ToolCallText(forced=mode(request) == "forced", parallel=request.parallel_tool_calls)
            return choice

        async def start() -> None:
            """Every choice's first delta. The first choice goes alone: once its first token is out, the prompt's
            full KV blocks are in the engine's prefix cache, and the other choices' prefills find them there."""
            first = await send(0)
            first.first = await first.triton.next_delta()
            others = [await send(index) for index in range(1, request.n)]
            for choice, delta in zip(others, await gather_all(c.triton.next_delta() for c in others), strict=True):
                choice.first = delta

        try:
            # Triton's refusals raise here, before any status is sent. A client that goes away meanwhile (queued
            # behind a busy engine) cancels its requests, which so leave the engine's queue.
            await until_disconnected(receive, start())
        except BaseException:
            generation.close()
            raise
        if request.stream:
            return SseResponse(generation.sse())
        try:
            return JSONResponse(await until_disconnected(receive, generation.body()))
        finally:
            generation.close()  # also when the client left before body() even started

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(counters.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.exception_handler(StarletteHTTPException)
    async def unknown_route(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """An unknown path (404) or method (405) in OpenAI's error shape, as OpenAI's API answers it."""
        code = "unknown_url" if exc.status_code == 404 else "method_not_allowed"
        return _error_response(ApiError(exc.status_code, f"Invalid URL ({request.method} {request.url.path}): this "
                                        "API serves /v1/chat/completions, /v1/completions and /v1/models", None, code))

    async def completion_routes(scope, receive, send) -> None:
        """POST /v1/chat/completions and /v1/completions as plain ASGI, ahead of FastAPI's middleware and router
        (0.2 ms of every first token, bench/openai.py); everything else is the FastAPI app's. Every HTTP request
        is counted (refusals by reason) and, unless turned off, logged when it ends."""
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        record = AccessRecord(time.perf_counter())

        async def recording_send(message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            elif record.status >= 400 and not record.reason and message.get("body"):
                record.reason = _error_code(message["body"])
            await send(message)

        route = COMPLETION_ROUTES.get(scope["path"])
        try:
            if route is None:
                await app(scope, receive, recording_send)
                return
            try:
                if scope["method"] != "POST":
                    raise ApiError(405, f"Invalid method ({scope['method']} {scope['path']}): use POST", None,
                                   "method_not_allowed")
                response = await complete(scope, receive, record, *route)
            except ApiError as error:
                response = _error_response(error)
            except Exception as exc:  # a bug: still OpenAI's error JSON, and the process keeps serving
                log.exception("unexpected error")
                response = _error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", None,
                                                    "internal_error"))
            await response(scope, receive, recording_send)
        finally:
            counters.count(record)
            if log_access:
                record.log(scope)

    return completion_routes


def _error_code(body: bytes) -> str:
    """The `code` of OpenAI's error JSON (the reason a request was refused)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return str(orjson.loads(body)["error"]["code"])
    return "unknown"


@dataclass(slots=True)
class AccessRecord:
    """One HTTP request, for the access log and the counters."""

    started: float
    status: int = 499  # no response started: the client went away first
    reason: str = ""  # the error's code, for a status >= 400
    generation: Generation | None = None

    def log(self, scope) -> None:
        tokens = ""
        if self.generation is not None:
            tokens = (f" prompt_tokens={self.generation.prompt_tokens} "
                      f"completion_tokens={self.generation.completion_tokens}")
        access_log.info("%s %s %d%s%s %.3fs", scope["method"], scope["path"], self.status,
                        f" {self.reason}" if self.reason else "", tokens, time.perf_counter() - self.started)


class FrontendCounters:
    """The frontend's own Prometheus counters (GET /metrics on the API port): requests by status, and refused
    requests (4xx/5xx, the client's disconnect too) by reason, the OpenAI error's `code`. Triton's
    nv_inference_request_success counts what Triton itself answered; a request refused here never reaches it."""

    def __init__(self) -> None:
        self.responses: collections.Counter[int] = collections.Counter()
        self.refused: collections.Counter[tuple[int, str]] = collections.Counter()

    def count(self, record: AccessRecord) -> None:
        self.responses[record.status] += 1
        if record.status >= 400:
            self.refused[record.status, record.reason or ("client_closed" if record.status == 499 else "unknown")] += 1

    def exposition(self) -> bytes:
        lines = ["# HELP trtllm_openai_requests_total HTTP requests the OpenAI API answered, by status.",
                 "# TYPE trtllm_openai_requests_total counter"]
        lines += [f'trtllm_openai_requests_total{{status="{status}"}} {n}' for status, n in sorted(self.responses.items())]
        lines += ["# HELP trtllm_openai_requests_refused_total Requests refused or failed (status >= 400; 499: the "
                  "client went away), by status and reason (the error's code).",
                  "# TYPE trtllm_openai_requests_refused_total counter"]
        lines += [f'trtllm_openai_requests_refused_total{{status="{status}",reason="{reason}"}} {n}'
                  for (status, reason), n in sorted(self.refused.items())]
        return ("\n".join(lines) + "\n").encode()


class _JoinedWrites:
    """A connection's transport that joins what is written within one turn of the event loop into one write: a
    response's head leaves with its first body bytes, and a stream's last event, [DONE] and the chunked terminator
    leave together. Fewer writes, fewer wakeups of the client (0.1-0.2 ms of every first token, bench/openai.py).
    The first body bytes after a head are sent at once; anything else when the turn ends (a head alone, too)."""

    __slots__ = ("_transport", "_loop", "_pending", "_head_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []
        self._head_pending = False

    def write(self, data: bytes) -> None:
        if self._head_pending:
            self._pending.append(data)
            self._send_pending()
            return
        if not self._pending:
            if data.startswith(b"HTTP/1.") and data[9:10] == b"1":  # 100 Continue: the client waits for it
                self._transport.write(data)
                return
            self._loop.call_soon(self._send_pending)
        self._head_pending = data.startswith(b"HTTP/1.") and data.endswith(b"\r\n\r\n")
        self._pending.append(data)

    def _send_pending(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._head_pending = False
            if not self._transport.is_closing():  # the client went away meanwhile
                self._transport.write(data)

    def close(self) -> None:
        self._send_pending()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


def _http_protocol():
    """uvicorn's httptools protocol over _JoinedWrites."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Protocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(_JoinedWrites(transport, self.loop))

    return Protocol


def run(urls: list[str], host: str, port: int, executor: str | None = None, log_level: str = "warning",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, model_repository: str | None = None,
        log_access: bool = True, served_model_name: str | None = None) -> None:
    """Serve the API until SIGINT/SIGTERM (uvicorn lets open responses finish first). The access log (a line per
    request: method, path, status, error code, tokens in and out, seconds) goes to stderr."""
    import uvicorn

    if log_access:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s openai-access: %(message)s"))
        access_log.addHandler(handler)
        access_log.setLevel(logging.INFO)
        access_log.propagate = False
    app = create_app(urls, executor, f"trtllm-triton openai: ready. http://{host}:{port}/v1 -> Triton gRPC "
                     f"{', '.join(urls)}", max_body_bytes, model_repository, log_access, served_model_name)
    # No X-Forwarded-* handling (nothing here uses the client's address: one ASGI layer less per request), no access
    # log below "info" (uvicorn formats each line's fields even when the logger drops it), no "server" header.
    uvicorn.run(app, host=host, port=port, log_level=log_level, loop="uvloop", http=_http_protocol(),
                proxy_headers=False, access_log=False, server_header=False,
                timeout_graceful_shutdown=10)
