"""The OpenAI frontend's pure parts: stop strings over a token stream, Triton errors to OpenAI statuses, request
validation, and its place in the layering (a separate process: the model never imports it, it never imports the
model's Triton edge)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from test_layering import PACKAGE, imported_modules

from trtllm_model.executors.synthetic import SyntheticTokenizer
from trtllm_model.openai_frontend import app as app_module
from trtllm_model.openai_frontend import generation as generation_module
from trtllm_model.openai_frontend.app import _JoinedWrites
from trtllm_model.openai_frontend.protocol import ApiError, ChatRequest, CompletionRequest, parse_body
from trtllm_model.openai_frontend.text_stream import TextStream
from trtllm_model.openai_frontend.triton_pool import ModelInfo, api_error_from_triton, generation_request

TOKENIZER = SyntheticTokenizer()  # ids under 256 are bytes: a token per character
TESTS_DIR = Path(__file__).resolve().parent


def stream_text(text: str, stops: list[str], chunk: int = 1) -> tuple[list[str], TextStream]:
    stream = TextStream(TOKENIZER, stops)
    ids = TOKENIZER.encode(text)
    pieces = [stream.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    pieces.append(stream.finish())
    return pieces, stream


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_stop_string_never_leaks_even_in_part(chunk):
    pieces, stream = stream_text("hello world, stop here", [", st", "zz"], chunk)
    assert "".join(pieces) == "hello world"
    assert all("," not in piece for piece in pieces)
    assert stream.stopped and stream.tokens == len("hello world, st")  # counted up to the token ending the stop


def test_earliest_stop_wins_and_text_without_stop_is_whole():
    pieces, stream = stream_text("abcdef", ["de", "bc"])
    assert "".join(pieces) == "a" and stream.tokens == 3
    pieces, stream = stream_text("abcdef", ["xy"])
    assert "".join(pieces) == "abcdef" and not stream.stopped and stream.tokens == 6


def test_held_back_text_is_only_a_possible_stop_prefix():
    stream = TextStream(TOKENIZER, ["abc"])
    assert stream.push(TOKENIZER.encode("xyza")) == "xyz"  # "a" could begin "abc"
    assert stream.push(TOKENIZER.encode("b")) == ""  # so could "ab"
    assert stream.push(TOKENIZER.encode("q")) == "abq"
    assert stream.finish() == "" and not stream.stopped


def test_triton_errors_map_to_openai_statuses():
    names = {"request_output_len": "max_tokens", "top_p": "top_p"}
    bad = api_error_from_triton("INVALID_ARG: request_output_len=9: must be at most 4", names)
    assert (bad.status, bad.param, bad.message) == (400, "max_tokens", "max_tokens=9: must be at most 4")
    assert api_error_from_triton("UNSUPPORTED: beam_width=2: no", names).status == 400
    assert api_error_from_triton("UNAVAILABLE: queue full: 40 requests in flight", names).status == 429
    assert api_error_from_triton("UNAVAILABLE: model is shutting down", names).status == 503
    assert api_error_from_triton("[request id: x] Request for unknown model: 'm' is not found", names).status == 503
    assert api_error_from_triton("INTERNAL: executor error: boom", names).status == 500


@pytest.mark.parametrize(("body", "param"), [
    (b'{"model": "m", "messages": []}', "messages"),
    (b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}', "messages.0.role"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": -0.1}', "top_p"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}', "stop"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', "tool_choice"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}',
     "response_format"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
     "response_format.type"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "min_tokens": -1}', "min_tokens"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [""]}', "stop"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}',
     "stream_options"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}', "tools.0.function"),
])
def test_invalid_chat_bodies_are_400_naming_the_field(body, param):
    with pytest.raises(ApiError) as refused:
        parse_body(body, ChatRequest)
    assert (refused.value.status, refused.value.param) == (400, param)
    assert refused.value.message.startswith(param)


def test_completion_prompt_forms():
    assert parse_body(b'{"model": "m", "prompt": "hi"}', CompletionRequest).single_prompt() == "hi"
    assert parse_body(b'{"model": "m", "prompt": [1, 2]}', CompletionRequest).single_prompt() == [1, 2]
    assert parse_body(b'{"model": "m", "prompt": [[3]]}', CompletionRequest).single_prompt() == [3]
    with pytest.raises(ApiError) as several:
        parse_body(b'{"model": "m", "prompt": ["a", "b"]}', CompletionRequest).single_prompt()
    assert several.value.param == "prompt"


def test_frontend_and_model_stay_apart():
    frontend = PACKAGE / "openai_frontend"
    edge = ("trtllm_model.triton.model", "trtllm_model.triton.triton_io", "trtllm_model.serving.poller", "trtllm_model.triton.bls_forwarding")
    for path in frontend.glob("*.py"):
        offending = {name for name in imported_modules(path) if any(name == e or name.startswith(f"{e}.") for e in edge)}
        assert not offending, f"{path.name} imports {offending}"
    for path in PACKAGE.rglob("*.py"):
        if frontend not in path.parents and path.name != "cli.py":
            assert not any(n.startswith("trtllm_model.openai_frontend") for n in imported_modules(path)), path


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_writes_within_one_loop_turn_leave_together():
    async def scenario() -> RecordingTransport:
        transport = RecordingTransport()
        joined = _JoinedWrites(transport, asyncio.get_running_loop())
        joined.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # an interim answer the client waits for: at once
        assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
        joined.write(head)
        joined.write(b"5\r\nhello\r\n")  # the first body bytes: sent at once, with the head
        assert transport.writes[1:] == [head + b"5\r\nhello\r\n"]
        joined.write(b"4\r\nlast\r\n")
        joined.write(b"0\r\n\r\n")
        assert len(transport.writes) == 2  # held until the turn ends ...
        await asyncio.sleep(0)
        assert transport.writes[2] == b"4\r\nlast\r\n0\r\n\r\n"  # ... then one write
        joined.write(b"HTTP/1.1 204 No Content\r\n\r\n")  # a head with no body after it
        await asyncio.sleep(0)
        assert transport.writes[3] == b"HTTP/1.1 204 No Content\r\n\r\n"
        joined.write(b"HTTP/1.1 200 OK\r\n\r\n")
        joined.close()  # closing sends what is held first
        assert transport.writes[4] == b"HTTP/1.1 200 OK\r\n\r\n" and transport.closed
        joined.write(b"late")
        await asyncio.sleep(0)  # nothing goes to a closed connection
        assert joined.is_closing()
        return transport

    transport = asyncio.run(scenario())
    assert len(transport.writes) == 5


@pytest.mark.parametrize("body", [b'{"model": "m", "messages": [', b"\xff\xfe", b"", b"{bad"])
def test_a_body_that_is_not_json_is_400_saying_so_once(body):
    with pytest.raises(ApiError) as refused:
        parse_body(body, ChatRequest)
    assert (refused.value.status, refused.value.code) == (400, "invalid_json")
    assert refused.value.message.startswith("the request body is not valid JSON: ")
    assert "Invalid JSON" not in refused.value.message


def test_a_body_that_is_json_but_not_an_object_is_400():
    with pytest.raises(ApiError) as refused:
        parse_body(b"[1, 2]", ChatRequest)
    assert (refused.value.status, refused.value.message) == (400, "the request body must be a JSON object")


def lines_run_in(module, work) -> int:
    """How many lines of `module`'s code run during `work()`: a count of operations, not a wall time."""
    count = 0
    filename = module.__file__

    def trace(frame, event, _arg):
        nonlocal count
        if frame.f_code.co_filename != filename:
            return None
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


def test_stop_string_scanning_is_linear_in_the_text():
    """Two long stop strings that never end, over a text that keeps a long end held back for one of them: a token
    costs in proportion to its own text, not to the stop strings' length (nor the text so far)."""
    import trtllm_model.openai_frontend.text_stream as text_stream_module

    def lines_for(text_length: int, stop_length: int) -> int:
        stops = ["b" * stop_length + "z", "a" * stop_length + "z"]
        stream = TextStream(TOKENIZER, stops)
        ids = TOKENIZER.encode("a" * text_length)
        released: list[str] = []
        count = lines_run_in(text_stream_module, lambda: released.extend(stream.push([i]) for i in ids))
        assert "".join(released) + stream.finish() == "a" * text_length and not stream.stopped
        return count

    base = lines_for(2000, 100)
    assert lines_for(4000, 100) <= 2.2 * base  # twice the text: twice the work
    assert lines_for(2000, 1000) <= base + 20 * 2 * 1000  # ten times longer stops: only their one-off table grows


@pytest.mark.parametrize("chunk", [1, 3])
def test_a_stop_string_spanning_pushes_is_found(chunk):
    # "world" begins in one push and ends in a later one; "orl" ends first but begins later: the earliest-ending
    # stop string cuts the text.
    pieces, stream = stream_text("hello world", ["lo wo", "xyz"], chunk)
    assert "".join(pieces) == "hel" and stream.stopped and stream.tokens == len("hello wo")
    pieces, stream = stream_text("abcabcabd", ["abcabd"], chunk)  # a false start overlapping the real one
    assert "".join(pieces) == "abc" and stream.stopped
    pieces, stream = stream_text("aab", ["aab", "ab"], chunk)  # two end together: the one that begins first cuts
    assert "".join(pieces) == "" and stream.stopped


class FakePool:
    """TritonPool's part the completion routes use, without a Triton: one model; sending fails after the prompt
    is tokenized (the tests here end there)."""

    def __init__(self, urls: list[str], executor: str | None = None, model_repository: str | None = None) -> None:
        self.info = ModelInfo("m", FakePool.tokenizer, None, None)
        self.sent: list[list[int]] = []

    async def refresh_models(self) -> dict[str, str]:
        return {"m": "READY"}

    async def model(self, name: str) -> ModelInfo:
        return self.info

    async def is_ready(self) -> bool:
        FakePool.on_health()
        return True

    async def send(self, info: ModelInfo, input_ids: list[int], sampling) -> None:
        self.sent.append(input_ids)
        raise ApiError(503, "no Triton here", None, "triton_unavailable")

    async def close(self) -> None:
        pass

    tokenizer = TOKENIZER
    on_health = staticmethod(lambda: None)


@contextlib.asynccontextmanager
async def running_app(monkeypatch, max_body_bytes: int = app_module.DEFAULT_MAX_BODY_BYTES):
    """The frontend's ASGI app over a FakePool, its lifespan started (as uvicorn does) and ended after."""
    monkeypatch.setattr(app_module, "TritonPool", FakePool)
    app = app_module.create_app(["127.0.0.1:1"], max_body_bytes=max_body_bytes)
    events: asyncio.Queue = asyncio.Queue()
    started = asyncio.Event()
    await events.put({"type": "lifespan.startup"})

    async def send(message) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, events.get, send))
    await asyncio.wait_for(started.wait(), 10)
    try:
        yield app
    finally:
        await events.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(lifespan, 10)


async def http_call(app, method: str, path: str, chunks: list[bytes] = (), headers: dict[str, str] | None = None):
    """(status, JSON body, request body messages the app read) of one plain ASGI request."""
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)] or [{"type": "http.request", "body": b"", "more_body": False}]
    read = 0

    async def receive():
        nonlocal read
        if read < len(messages):
            read += 1
            return messages[read - 1]
        await asyncio.Event().wait()  # the client stays: no disconnect

    sent = []

    async def send(message) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 9000), "client": ("127.0.0.1", 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), read


def test_the_lifespan_unfreezes_at_shutdown_so_the_interpreter_exits_without_a_leak_report():
    """Startup freezes what it made (gc.freeze); shutdown must unfreeze it, or the modules' reference cycles outlive the
    interpreter's last collection and triton's nanobind extension (torch imports it) reports every object it has as
    leaked at exit (about 30 lines, at the end of `make test` too: the tests here run the lifespan in pytest's
    process)."""
    script = """
import asyncio, gc, types
import triton  # noqa: F401
import test_openai_frontend as t

async def scenario():
    async with t.running_app(types.SimpleNamespace(setattr=setattr)):
        assert gc.get_freeze_count() > 0

asyncio.run(scenario())
assert gc.get_freeze_count() == 0
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], cwd=TESTS_DIR, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "nanobind" not in done.stderr, done.stderr


def test_a_body_over_the_limit_is_413_without_reading_it(monkeypatch):
    async def scenario() -> None:
        async with running_app(monkeypatch, max_body_bytes=1000) as app:
            chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}).encode()
            # Declared too large: refused before any of the body is read.
            status, body, read = await http_call(app, "POST", "/v1/chat/completions", [chat],
                                                 {"content-length": str(len(chat))})
            assert (status, body["error"]["code"], read) == (413, "request_too_large", 0)
            assert body["error"]["type"] == "invalid_request_error" and "1000 bytes" in body["error"]["message"]
            # Chunked (no length given): refused at the chunk that passes the limit, the rest never read.
            pieces = [chat[i : i + 100] for i in range(0, len(chat), 100)]
            status, body, read = await http_call(app, "POST", "/v1/completions", pieces)
            assert (status, read) == (413, 11)
            # At the limit: read whole and answered on its merits.
            small = json.dumps({"model": "m", "prompt": [1, 2]}).encode()
            status, body, _ = await http_call(app, "POST", "/v1/completions", [small],
                                              {"content-length": str(len(small))})
            assert status == 503 and body["error"]["message"] == "no Triton here"

    asyncio.run(scenario())


def test_a_long_prompt_is_tokenized_off_the_event_loop(monkeypatch):
    """While a long prompt is encoded, the loop serves other connections: here /health, which the encode waits
    for (on the loop, it would wait in vain)."""
    health_seen = threading.Event()
    encoded_on: list[str] = []

    class SlowTokenizer(SyntheticTokenizer):
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            if len(text) > app_module.INLINE_TOKENIZE_CHARS:
                encoded_on.append("after /health" if health_seen.wait(5) else "blocking the loop")
            return super().encode(text, add_special_tokens)

    monkeypatch.setattr(FakePool, "tokenizer", SlowTokenizer())
    monkeypatch.setattr(FakePool, "on_health", staticmethod(health_seen.set))

    async def scenario() -> None:
        async with running_app(monkeypatch) as app:
            long_chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
            chat = asyncio.create_task(http_call(app, "POST", "/v1/chat/completions", [long_chat]))
            await asyncio.sleep(0.05)  # the chat request is being tokenized
            health_status, _, _ = await asyncio.wait_for(http_call(app, "GET", "/health"), 10)
            status, _, _ = await chat
            assert (health_status, status) == (200, 503)
            # A short prompt is tokenized on the loop (no thread handoff).
            short = json.dumps({"model": "m", "prompt": "hi"}).encode()
            assert (await http_call(app, "POST", "/v1/completions", [short]))[0] == 503

    asyncio.run(scenario())
    assert encoded_on == ["after /health"]


CHAT = '{"model": "m", "messages": [{"role": "user", "content": "x"}], '
COMPLETION = '{"model": "m", "prompt": "x", '
OUT_OF_RANGE = [
    (CHAT + '"max_tokens": 2147483648}', "max_tokens"),
    (CHAT + '"max_tokens": -1}', "max_tokens"),
    (CHAT + '"max_completion_tokens": 9223372036854775808}', "max_completion_tokens"),
    (CHAT + '"temperature": -0.5}', "temperature"),
    (CHAT + '"temperature": 1e400}', "temperature"),
    (CHAT + '"top_p": 1.5}', "top_p"),
    (CHAT + '"presence_penalty": -3}', "presence_penalty"),
    (CHAT + '"frequency_penalty": 2.5}', "frequency_penalty"),
    (CHAT + '"seed": -1}', "seed"),
    (CHAT + '"seed": 18446744073709551616}', "seed"),
    (CHAT + '"n": -1}', "n"),
    (CHAT + '"n": 2147483648}', "n"),
    (CHAT + '"top_logprobs": 21, "logprobs": true}', "top_logprobs"),
    (COMPLETION + '"logprobs": -1}', "logprobs"),
    (COMPLETION + '"logprobs": 2147483648}', "logprobs"),
    ('{"model": "m", "prompt": [1, 2147483648]}', "prompt"),
    ('{"model": "m", "prompt": [-1]}', "prompt"),
    ('{"model": "m", "prompt": [[5, 4294967296]]}', "prompt"),
]


@pytest.mark.parametrize(("body", "param"), OUT_OF_RANGE)
def test_out_of_range_values_are_400_naming_the_parameter(body, param):
    kind = ChatRequest if body.startswith(CHAT) else CompletionRequest
    with pytest.raises(ApiError) as refused:
        parse_body(body.encode(), kind)
    assert (refused.value.status, refused.value.param.split(".")[0]) == (400, param)
    assert "valid string" not in refused.value.message  # a token id prompt's bound, not the text prompt's type


def test_the_largest_accepted_values_fit_the_models_tensors():
    request = parse_body(b'{"model": "m", "prompt": [2147483647], "max_tokens": 2147483647, '
                         b'"seed": 18446744073709551615}', CompletionRequest)
    info = ModelInfo("m", TOKENIZER, None, None)
    sampling = app_module._sampling(request, info, 1)
    generation_request("r", info, request.single_prompt(), sampling)  # packs every value into its tensor


# -- structured output, tools and benchmark clients' parameters (issue 25) ------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat_body(**fields) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    return parse_body(json.dumps(body).encode(), ChatRequest)


def inputs_of(request) -> dict[str, bytes]:
    return {tensor.name: request.raw_input_contents[i] for i, tensor in enumerate(request.inputs)}


def test_response_format_and_tool_choice_become_nvidias_guide_inputs():
    from trtllm_model.openai_frontend.tools import guide_of

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [
        ({"response_format": {"type": "json_object"}}, ("json", None, "response_format")),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}}},
         ("json_schema", schema, "response_format")),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
         ("json_schema", {"type": "object", "properties": {"name": {"const": "get_weather"},
                                                          "arguments": WEATHER_TOOL["function"]["parameters"]},
                          "required": ["name", "arguments"], "additionalProperties": False}, "tools")),
    ]
    for fields, (kind, guide, param) in cases:
        found = guide_of(chat_body(**fields))
        assert (found.type, json.loads(found.guide) if found.guide else None, found.param) == (kind, guide, param)
    required = guide_of(chat_body(tools=[WEATHER_TOOL, {**WEATHER_TOOL, "function": {"name": "other"}}],
                                  tool_choice="required"))
    assert [c["properties"]["name"]["const"] for c in json.loads(required.guide)["anyOf"]] == ["get_weather", "other"]
    auto = json.loads(guide_of(chat_body(tools=[WEATHER_TOOL])).guide)
    assert auto["triggers"] == ["<tool_call>"] and auto["structures"][0]["schema"] == WEATHER_TOOL["function"]["parameters"]
    assert guide_of(chat_body(tools=[WEATHER_TOOL], tool_choice="none")) is None
    assert guide_of(chat_body(response_format={"type": "text"})) is None

    info = ModelInfo("m", TOKENIZER, None, None)
    request = chat_body(response_format={"type": "json_object"})
    sent = inputs_of(generation_request("r", info, [1, 2], app_module._sampling(request, info, 2)))
    assert sent["guided_decoding_guide_type"] == b"\x04\x00\x00\x00json" and "guided_decoding_guide" not in sent


def test_ignore_eos_and_min_tokens_map_onto_min_tokens_and_top_p_0_is_greedy():
    info = ModelInfo("m", TOKENIZER, None, None)

    def sent(**fields) -> dict[str, bytes]:
        request = chat_body(**fields)
        return inputs_of(generation_request("r", info, [1], app_module._sampling(request, info, 1)))

    assert sent(max_tokens=160, ignore_eos=True)["min_tokens"] == (160).to_bytes(4, "little")
    assert sent(max_tokens=160, min_tokens=20)["min_tokens"] == (20).to_bytes(4, "little")
    assert sent(max_tokens=8, min_tokens=20)["min_tokens"] == (8).to_bytes(4, "little")  # never past max_tokens
    assert "min_tokens" not in sent(max_tokens=8)
    greedy = sent(top_p=0, temperature=0.7)
    assert "top_p" not in greedy and "temperature" not in greedy


def test_an_over_long_prompt_is_openais_context_length_exceeded():
    names = app_module._PARAM_NAMES["max_tokens", "messages", None, "min_tokens", "top_logprobs"]
    for text in ("input length 3000 exceeds max_num_tokens=2048",
                 "input length 100 + max_tokens 9000 exceeds the model's 8192 positions",
                 "input_ids: prompt of 5000 tokens is over max_input_len=4096",
                 "request_output_len=100: with the prompt's 4000 tokens that is 4100, over max_seq_len=4096"):
        error = api_error_from_triton(f"INVALID_ARG: {text}", names)
        assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "messages")
        assert "input_ids" not in error.message  # the prompt as the caller sent it
    assert api_error_from_triton("INVALID_ARG: top_p=2: no", names).code == "invalid_arg"


def test_a_guide_that_does_not_compile_names_the_openai_parameter():
    names = app_module._PARAM_NAMES["max_tokens", "messages", "response_format", "min_tokens", "top_logprobs"]
    error = api_error_from_triton("INVALID_ARG: guided_decoding_guide: the json_schema guide does not compile: "
                                  'Unsupported type "bogus"', names)
    assert (error.status, error.param) == (400, "response_format")
    assert error.message.startswith("response_format: guided_decoding_guide:") and "bogus" in error.message


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_tool_calls_are_split_from_the_content_as_the_text_streams(chunk):
    from trtllm_model.openai_frontend.tools import ToolCallText, call_text

    text = "Let me check. " + call_text("get_weather", '{"city": "Paris"}') + call_text("get_time", "{}")
    calls_text = ToolCallText(forced=False)
    released = [calls_text.push(text[i : i + chunk]) for i in range(0, len(text), chunk)]
    assert all("<" not in piece for piece in released)  # a call's start is never released as content
    rest, calls = calls_text.finish()
    assert "".join(released) + rest == "Let me check. "
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]

    plain = ToolCallText(forced=False)
    assert plain.push("a < b <tool") == "a < b " and plain.finish() == ("<tool", [])

    forced = ToolCallText(forced=True)
    assert forced.push('{"name": "get_weather", "arguments": {"city": "Oslo"}}') == ""
    _, [call] = forced.finish()
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    cut = ToolCallText(forced=True)
    cut.push('{"name": "get_wea')
    assert cut.finish() == ('{"name": "get_wea', [])  # cut short by max_tokens: the text, no call


def test_tools_reach_a_template_that_ignores_them_as_a_system_message():
    """SmolLM2's template renders no tools: the prompt carries them in the system message; earlier calls and the
    tool's answer are in the conversation."""
    from trtllm_model.embedded.model_loading import load_tokenizer
    from trtllm_model.openai_frontend.tokenization import chat_prompt_ids
    from trtllm_model.openai_frontend.tools import conversation, tools_system_text

    tokenizer = load_tokenizer()
    request = chat_body(tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
    prompt = tokenizer.decode(chat_prompt_ids(tokenizer, conversation(request),
                                              [t.model_dump() for t in request.tools],
                                              tools_system_text(request.tools)))
    assert prompt.startswith("<|im_start|>system\nYou can call these tools") and '"get_weather"' in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\nsunny<|im_end|>" in prompt


def tool_call_with_spaces(spaces: int) -> str:
    """A call whose JSON has a run of whitespace inside (a model that pads): the shape that made the old regex
    parse take time quadratic in the run (16k spaces: seconds)."""
    return '<tool_call>{"name": "get_time",' + " " * spaces + '"arguments": {}}</tool_call>'


def parse_seconds(text: str, repeats: int = 7) -> float:
    from trtllm_model.openai_frontend.tools import ToolCallText

    best = float("inf")
    for _ in range(repeats):  # the fastest of several: what the parse costs, not what the machine did meanwhile
        calls_text = ToolCallText(forced=False)
        calls_text.push(text)
        started = time.perf_counter()
        _, calls = calls_text.finish()
        best = min(best, time.perf_counter() - started)
        assert [c["function"]["name"] for c in calls] == ["get_time"]
    return best


def test_tool_call_parsing_is_linear_in_the_whitespace_of_a_call():
    """4x the whitespace costs about 4x (quadratic: 16x); 64k spaces parse in well under a second (e488561: 4k
    spaces 0.26 s, 16k 4.2 s, 64k over a minute)."""
    small, large = parse_seconds(tool_call_with_spaces(4096)), parse_seconds(tool_call_with_spaces(16384))
    assert large <= 8 * small + 0.002, (small, large)
    assert parse_seconds(tool_call_with_spaces(65536), repeats=1) < 1.0


def test_a_long_tool_call_answer_is_parsed_off_the_event_loop():
    """An answer over INLINE_TOOL_PARSE_CHARS is parsed in a worker thread (the loop serves other connections);
    a short one inline."""
    from trtllm_model.openai_frontend.tools import ToolCallText

    threads = []

    class RecordingCalls(ToolCallText):
        def finish(self):
            threads.append(threading.get_ident())
            return super().finish()

    async def parse(text: str):
        calls_text = RecordingCalls(forced=False)
        calls_text.push(text)
        return await generation_module.Choice.finish_calls(types.SimpleNamespace(calls=calls_text))

    for spaces in (10, 4 * generation_module.INLINE_TOOL_PARSE_CHARS):
        _, calls = asyncio.run(parse(tool_call_with_spaces(spaces)))
        assert [c["function"]["name"] for c in calls] == ["get_time"]
    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread
    assert threads[0] == loop_thread and threads[1] != loop_thread


def test_parallel_tool_calls_is_honoured():
    """false: the first call only; true with tool_choice required: the guide asks for a list of one or more calls,
    each of which comes back; unset: as before (one call)."""
    from trtllm_model.openai_frontend.tools import ToolCallText, call_text, guide_of

    text = call_text("get_weather", '{"city": "Paris"}') + call_text("get_time", "{}")
    for parallel, names in ((None, ["get_weather", "get_time"]), (True, ["get_weather", "get_time"]),
                            (False, ["get_weather"])):
        calls_text = ToolCallText(forced=False, parallel=parallel)
        calls_text.push(text)
        assert [c["function"]["name"] for c in calls_text.finish()[1]] == names

    one = json.loads(guide_of(chat_body(tools=[WEATHER_TOOL], tool_choice="required")).guide)
    many = json.loads(guide_of(chat_body(tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=True)).guide)
    assert many == {"type": "array", "items": one, "minItems": 1}
    forced = ToolCallText(forced=True, parallel=True)
    forced.push('[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {}}]')
    assert [json.loads(c["function"]["arguments"]) for c in forced.finish()[1]] == [{"city": "Oslo"}, {}]


def test_over_max_output_len_is_refused_naming_max_tokens():
    info = ModelInfo("m", TOKENIZER, 4096, None)
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(ApiError) as refused:
            app_module._sampling(chat_body(**{field: 4097}), info, 2)
        assert refused.value.body()["error"] == {"message": f"{field}=4097: must be at most 4096 (the model's "
                                                 "max_output_len)", "type": "invalid_request_error", "param": field,
                                                 "code": "invalid_value"}
    assert app_module._sampling(chat_body(max_tokens=4096), info, 2).max_tokens == 4096


def test_n_and_best_of_equal_to_n_are_accepted_and_best_of_above_n_refused():
    assert parse_body(COMPLETION + '"n": 3, "best_of": 3}', CompletionRequest).n == 3
    assert parse_body(CHAT + '"n": 2, "logprobs": true, "top_logprobs": 20}', ChatRequest).top_logprobs == 20
    for body, model, param in ((COMPLETION + '"n": 2, "best_of": 3}', CompletionRequest, "best_of"),
                               (CHAT + '"n": 0}', ChatRequest, "n")):
        with pytest.raises(ApiError) as refused:
            parse_body(body, model)
        assert refused.value.param == param and refused.value.status == 400


def test_top_logprobs_go_to_the_embedded_engine_and_are_refused_naming_the_executor_elsewhere():
    """num_top_log_probs is sent (with its outputs asked for) to a model that takes it; TensorRT-LLM's executor API
    returns only the sampled token's log prob: a 400 naming the parameter, the model and its executor."""
    request = chat_body(logprobs=True, top_logprobs=4)
    embedded = ModelInfo("m", TOKENIZER, None, None, inputs=frozenset({"num_top_log_probs"}))
    sent = generation_request("r", embedded, [1], app_module._sampling(request, embedded, 1))
    assert inputs_of(sent)["num_top_log_probs"] == b"\x04\x00\x00\x00"
    assert {"output_top_log_prob_ids", "output_top_log_probs"} <= {output.name for output in sent.outputs}
    engine = ModelInfo("m", TOKENIZER, None, None, inputs=frozenset({"num_top_log_probs"}), executor="trtllm_engine")
    with pytest.raises(ApiError) as refused:
        generation_request("r", engine, [1], app_module._sampling(request, engine, 1))
    assert refused.value.param == "top_logprobs" and "trtllm_engine" in refused.value.message
