"""The OpenAI-compatible frontend against a real tritonserver with the synthetic executor, through the official
`openai` client: responses in OpenAI's schema, stop strings, usage, every error status, 32 concurrent streams,
a client that disconnects mid-stream, and the frontend stopping with the server.

The synthetic executor makes every token predictable: token i after a prompt whose last id is b is
(b + 1 + i) % vocab_size, and its tokenizer is byte-level (ids under 256 are bytes), so the expected text is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import psutil
import pytest
import requests
from openai import AsyncOpenAI, OpenAI
from openai_server import start_openai_server
from prometheus_text import scrape
from triton_client import StreamClient, token_inputs

from trtllm_model.executors.synthetic import SyntheticTokenizer, synthetic_token
from trtllm_model.openai_frontend.tokenization import chat_prompt_ids
from trtllm_model.server import ADMIN_KEY_ENV, free_ports

pytestmark = pytest.mark.e2e

VOCAB = 32000
TOKENIZER = SyntheticTokenizer()
# max_batch_size + max_queue_size = 40 requests held at most: 32 streams fit, the 41st is refused (queue full).
PARAMETERS = {"max_batch_size": "8", "max_queue_size": "32"}
HI = [{"role": "user", "content": "Hi"}]


def expected_text(prompt_ids: list[int], count: int) -> str:
    return TOKENIZER.decode([synthetic_token(prompt_ids, i, VOCAB) for i in range(count)])


def chat_ids(messages) -> list[int]:
    return chat_prompt_ids(TOKENIZER, messages)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server, base_url = start_openai_server(tmp_path_factory.mktemp("openai-synthetic"), "synthetic", PARAMETERS)
    yield server, base_url
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return OpenAI(base_url=served[1], api_key="none", max_retries=0)


def open_requests(server) -> float:
    return scrape(server.metrics_url).value("nv_llm_open_requests", model="tensorrt_llm")


def wait_open_requests(server, count: int, timeout_s: float = 10.0) -> None:
    """Until the model's open-request gauge reads `count` (it is refreshed every stats period, not at once)."""
    deadline = time.monotonic() + timeout_s
    while (held := open_requests(server)) != count:
        assert time.monotonic() < deadline, f"{held} requests open after {timeout_s} s, expected {count}"
        time.sleep(0.05)


def test_models_lists_the_token_level_model(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tensorrt_llm"]  # the text-only ensemble cannot take token ids: not offered


def test_chat_non_streamed_in_openai_schema(client):
    reply = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=6)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.model == "tensorrt_llm"
    assert abs(reply.created - time.time()) < 60
    (choice,) = reply.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_text(chat_ids(HI), 6)
    assert choice.finish_reason == "length"
    prompt = len(chat_ids(HI))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (prompt, 6, prompt + 6)


def test_chat_streamed_role_first_content_after_usage_last(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More?"}]
    chunks = list(client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert "".join(content) == expected_text(chat_ids(messages), 5)
    # Streamed as generated: a chunk per response, a token each unless a loaded machine made the model deliver two
    # steps in one response (the poller coalesces a request's ready steps rather than fall behind).
    assert 2 <= len(content) <= 5
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == len(chat_ids(messages))
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_content_concatenates_to_the_non_streamed(client):
    whole = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=12, temperature=0)
    parts = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in parts) == whole.choices[0].message.content


def test_completions_from_text_and_from_token_ids(client):
    reply = client.completions.create(model="tensorrt_llm", prompt="abc", max_tokens=4)
    assert reply.object == "text_completion" and reply.choices[0].text == "defg"
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 4)

    from_ids = client.completions.create(model="tensorrt_llm", prompt=[7, 300], max_tokens=3)
    assert from_ids.choices[0].text == expected_text([7, 300], 3) == " w301 w302 w303"
    assert from_ids.usage.prompt_tokens == 2

    streamed = list(client.completions.create(model="tensorrt_llm", prompt="abc", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == "defg"
    assert streamed[-1].choices[0].finish_reason == "length"


def test_stop_strings_end_the_text_before_the_stop(client):
    reply = client.completions.create(model="tensorrt_llm", prompt="a", max_tokens=20, stop=["xyz", "de"])
    assert reply.choices[0].text == "bc" and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == 4  # b c d e: generation ends at the token that completes the stop

    chunks = list(client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=30, stream=True,
                                                 stop="?@"))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    full = expected_text(chat_ids(HI), 30)
    assert text == full[: full.index("?@")] and text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_and_top_logprobs_as_the_engine_gives_them(client):
    reply = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=3, logprobs=True)
    entries = reply.choices[0].logprobs.content
    assert [e.token for e in entries] == list(expected_text(chat_ids(HI), 3))
    assert [e.logprob for e in entries] == [-0.5] * 3  # the synthetic engine's value
    assert all(e.top_logprobs == [] for e in entries)
    # The synthetic engine's alternatives: the token itself (-0.5), then the ids after it, each 1 less likely.
    reply = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=3, logprobs=True,
                                           top_logprobs=2)
    expected = expected_text(chat_ids(HI), 4)
    assert [[(t.token, t.logprob) for t in e.top_logprobs] for e in reply.choices[0].logprobs.content] == [
        [(expected[i], -0.5), (expected[i + 1], -1.5)] for i in range(3)]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=3, top_logprobs=2)
    assert refused.value.body["param"] == "top_logprobs" and "logprobs=true" in refused.value.body["message"]


def test_n_choices_each_with_its_index_usage_counting_the_prompt_once(client):
    """n > 1: n sequences of the one prompt (the synthetic engine's are alike), choices indexed 0..n-1; usage counts
    the prompt once and every choice's tokens."""
    expected = expected_text(chat_ids(HI), 4)
    reply = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=4, n=3, logprobs=True)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.message.content for c in reply.choices] == [expected] * 3
    assert all(len(c.logprobs.content) == 4 and c.finish_reason == "length" for c in reply.choices)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(chat_ids(HI)), 12)

    stream = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=4, n=3, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert [c.choices[0].delta.role for c in chunks[:3]] == ["assistant"] * 3  # a role chunk per choice first
    assert sorted(c.choices[0].index for c in chunks[:3]) == [0, 1, 2]
    for index in range(3):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.delta.content or "" for c in mine) == expected
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"] and mine[-1].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12

    completion = client.completions.create(model="tensorrt_llm", prompt="abc", max_tokens=3, n=2, best_of=2,
                                           stream=True)
    texts = {0: "", 1: ""}
    for chunk in completion:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == {0: "def", 1: "def"}


def test_invalid_parameters_are_400_naming_the_parameter(client, served):
    with pytest.raises(openai.BadRequestError) as local:
        client.chat.completions.create(model="tensorrt_llm", messages=HI, temperature=5)
    assert local.value.status_code == 400 and local.value.body["param"] == "temperature"
    assert local.value.body["type"] == "invalid_request_error"

    # Over the model's max_output_len: named as the caller sent it, not as the model's request_output_len tensor.
    for over in (4097, 100000):
        with pytest.raises(openai.BadRequestError) as too_many:
            client.completions.create(model="tensorrt_llm", prompt="a", max_tokens=over)
        assert too_many.value.body == {"message": f"max_tokens={over}: must be at most 4096 (the model's "
                                       "max_output_len)", "type": "invalid_request_error", "param": "max_tokens",
                                       "code": "invalid_value"}

    with pytest.raises(openai.BadRequestError) as several:  # over the model's max_batch_size (8 here)
        client.chat.completions.create(model="tensorrt_llm", messages=HI, n=9)
    assert several.value.body["param"] == "n" and "max_batch_size" in several.value.body["message"]

    base_url = served[1]
    for body in (b'{"model": "tensorrt_llm", "messages": [', b"[1, 2]", b"\xff\xfe", b""):
        answer = requests.post(f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400, body
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(("extra", "param"), [
    ({"max_tokens": 2**31}, "max_tokens"), ({"max_tokens": -1}, "max_tokens"), ({"n": 2**31}, "n"),
    ({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"), ({"seed": 2**64}, "seed"),
    ({"logprobs": 2**31}, "logprobs"), ({"prompt": [7, 2**31]}, "prompt.1"), ({"prompt": [[-1]]}, "prompt.0.0"),
])
def test_out_of_range_values_are_400_not_500(served, extra, param):
    answer = requests.post(f"{served[1]}/completions", json={"model": "tensorrt_llm", "prompt": "a", **extra},
                           timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param and answer.json()["error"]["type"] == "invalid_request_error"


def test_a_body_over_4_mib_is_413(served):
    body = b'{"model": "tensorrt_llm", "prompt": "' + b"a" * (4 << 20) + b'"}'
    answer = requests.post(f"{served[1]}/completions", data=body, headers={"Content-Type": "application/json"},
                           timeout=60)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    chunked = requests.post(f"{served[1]}/completions", data=iter([body[i : i + 65536]
                                                                   for i in range(0, len(body), 65536)]), timeout=60)
    assert chunked.status_code == 413  # no Content-Length: counted as it comes
    # The frontend serves the next request as usual.
    assert requests.post(f"{served[1]}/completions", json={"model": "tensorrt_llm", "prompt": "abc", "max_tokens": 3},
                         timeout=30).json()["choices"][0]["text"] == "def"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert missing.value.body["code"] == "model_not_found" and missing.value.body["param"] == "model"


def test_32_concurrent_streams_all_complete(served):
    async def one(client: AsyncOpenAI, number: int) -> str:
        messages = [{"role": "user", "content": f"stream {number}"}]
        stream = await client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=16,
                                                      stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream])

    async def run_all() -> list[str]:
        async with AsyncOpenAI(base_url=served[1], api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(one(client, n) for n in range(32)))

    texts = asyncio.run(run_all())
    expected = [expected_text(chat_ids([{"role": "user", "content": f"stream {n}"}]), 16) for n in range(32)]
    assert texts == expected


def test_queue_full_is_429(client, served):
    server = served[0]
    filler = StreamClient(server.grpc_url)
    try:
        held = [filler.send("tensorrt_llm", token_inputs([5, n], 3000), f"fill-{n}") for n in range(40)]
        deadline = time.monotonic() + 10
        while open_requests(server) < 40:
            assert time.monotonic() < deadline and not any(r.errors for r in held)
            time.sleep(0.05)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=2, stream=True)
        assert refused.value.status_code == 429 and "queue full" in refused.value.body["message"]
    finally:
        filler.cancel()
        filler.close()
    wait_open_requests(server, 0)


def test_client_disconnect_mid_stream_cancels_the_triton_request(client, served):
    server = served[0]
    wait_open_requests(server, 0)
    stream = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=3000, stream=True)
    received = [next(stream) for _ in range(4)]  # 3000 tokens would take 30 s
    assert received[-1].choices[0].delta.content
    wait_open_requests(server, 1)
    stream.close()
    wait_open_requests(server, 0, timeout_s=5.0)


def test_client_disconnect_before_a_non_streamed_answer_cancels_too(served):
    server, base_url = served
    wait_open_requests(server, 0)
    body = {"model": "tensorrt_llm", "messages": HI, "max_tokens": 3000}
    with pytest.raises(requests.ReadTimeout):  # the client gives up and closes the connection
        requests.post(f"{base_url}/chat/completions", json=body, timeout=(5, 1.0))
    wait_open_requests(server, 0, timeout_s=5.0)


def test_model_not_ready_is_503(client, served):
    server = served[0]
    repository = f"{server.http_url}/v2/repository/models/tensorrt_llm"
    requests.post(f"{repository}/unload", json={}, headers=server.admin_headers, timeout=60).raise_for_status()
    try:
        with pytest.raises(openai.InternalServerError) as unavailable:
            client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=2)
        assert unavailable.value.status_code == 503
        assert unavailable.value.body["type"] == "service_unavailable_error"
    finally:
        requests.post(f"{repository}/load", json={}, headers=server.admin_headers, timeout=120).raise_for_status()
    assert client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=2).choices[0].message.content


def test_the_frontend_process_holds_no_admin_key_and_still_lists_and_serves(client, served):
    """The frontend `serve` starts finds its models without the repository index (restricted to the admin key), so
    its process is given no key: none in its environment, whatever serve's own environment holds."""
    server = served[0]
    (frontend,) = [child for child in psutil.Process(server.process.pid).children(recursive=True)
                   if "openai" in child.cmdline()]
    environment = Path(f"/proc/{frontend.pid}/environ").read_bytes()
    assert ADMIN_KEY_ENV.encode() not in environment and server.admin_key.encode() not in environment
    assert "tensorrt_llm" in [model.id for model in client.models.list().data]
    assert client.completions.create(model="tensorrt_llm", prompt="abc", max_tokens=3).choices[0].text == "def"


def frontend_metrics(base_url: str):
    return scrape(base_url.removesuffix("/v1") + "/metrics")


def refused(base_url: str, status: int, reason: str) -> float:
    """The count of refusals by status and reason (0 before the first: no series yet)."""
    found = frontend_metrics(base_url).find("trtllm_openai_requests_refused_total", status=str(status), reason=reason)
    assert len(found) <= 1, found
    return sum(found.values())


def test_unknown_routes_are_404_in_openais_error_shape(served):
    base_url = served[1]
    for method, path in (("POST", "/v1/responses"), ("GET", "/v1/nothing"), ("GET", "/v2/models")):
        answer = requests.request(method, base_url.removesuffix("/v1") + path, json={}, timeout=10)
        assert answer.status_code == 404, path
        assert answer.json() == {"error": {"message": f"Invalid URL ({method} {path}): this API serves "
                                           "/v1/chat/completions, /v1/completions and /v1/models",
                                           "type": "invalid_request_error", "param": None, "code": "unknown_url"}}
    with pytest.raises(openai.NotFoundError) as missing:  # the official client's Responses API
        OpenAI(base_url=base_url, api_key="none", max_retries=0).responses.create(model="tensorrt_llm", input="Hi")
    assert missing.value.body["code"] == "unknown_url"


def test_usage_reports_cached_tokens_and_continuous_usage(client):
    """prompt_tokens_details.cached_tokens always (the synthetic engine reuses no KV blocks: 0; the embedded
    engine's reuse: test_e2e_openai_transformers.py); with stream_options.continuous_usage_stats every chunk carries
    the usage so far."""
    answer = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=4)
    assert answer.usage.prompt_tokens_details.cached_tokens == 0
    stream = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert all(c.usage is not None for c in chunks) and counts == sorted(counts) and counts[-1] == 5
    assert [c.usage.prompt_tokens for c in chunks] == [len(chat_ids(HI))] * len(chunks)
    plain = list(client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=5, stream=True,
                                                stream_options={"include_usage": True}))
    assert [c.usage is None for c in plain] == [True] * (len(plain) - 1) + [False]


def test_a_log_line_and_a_count_per_request(client, served):
    """The access log (stderr, in the server's log): method, path, status, tokens in and out, seconds; the
    frontend's /metrics counts refusals by reason, which Triton never sees."""
    server, base_url = served
    before = refused(base_url, 400, "unsupported_value")
    client.chat.completions.create(model="tensorrt_llm", messages=[{"role": "user", "content": "log me"}],
                                   max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tensorrt_llm", prompt="Hi", max_tokens=3, best_of=3)
    prompt_tokens = len(chat_ids([{"role": "user", "content": "log me"}]))
    deadline = time.monotonic() + 5
    pattern = re.compile(rf"openai-access: POST /v1/chat/completions 200 prompt_tokens={prompt_tokens} "
                         r"completion_tokens=3 \d+\.\d{3}s")
    # A line is written once its response has left, so the refusal's line may follow the answer's by a moment.
    while not (pattern.search(server.log()) and
               "openai-access: POST /v1/completions 400 unsupported_value" in server.log()):
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.1)
    assert refused(base_url, 400, "unsupported_value") == before + 1
    assert frontend_metrics(base_url).value("trtllm_openai_requests_total", status="200") >= 1


def queued_requests(server) -> float:
    return scrape(server.metrics_url).value("nv_llm_queued_requests", model="tensorrt_llm")


def test_clients_that_leave_before_their_first_token_leave_the_queue(served):
    """The engine busy (max_batch_size 8 long streams), 6 clients time out before their first token and close their
    connections: their Triton requests are cancelled, out of the engine's queue at once, not when they would have
    started (e488561: they stayed queued, each ahead of any later client)."""
    server, base_url = served
    wait_open_requests(server, 0)
    busy = OpenAI(base_url=base_url, api_key="none", max_retries=0)
    streams = [busy.chat.completions.create(model="tensorrt_llm", messages=[{"role": "user", "content": f"b{n}"}],
                                            max_tokens=3000, stream=True) for n in range(8)]
    try:
        wait_open_requests(server, 8)
        impatient = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=1.0)

        def leave(n: int) -> None:
            with pytest.raises(openai.APITimeoutError):
                impatient.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=5, stream=n % 2 == 0)

        leaving = [threading.Thread(target=leave, args=(n,)) for n in range(6)]
        for thread in leaving:
            thread.start()
        wait_open_requests(server, 14)  # queued behind the 8
        for thread in leaving:
            thread.join(10)
        deadline = time.monotonic() + 5.0
        while (held := (open_requests(server), queued_requests(server))) != (8, 0):  # the 6 left; the 8 run on
            assert time.monotonic() < deadline, f"(open, queued) = {held} 5 s after the clients left"
            time.sleep(0.05)
        assert refused(base_url, 499, "client_closed") >= 6  # the frontend's count of clients gone before an answer
    finally:
        for stream in streams:
            stream.close()
    wait_open_requests(server, 0)


@contextlib.contextmanager
def frontend_alone(*args: str, admin_key: str = "", output: list[str] | None = None):
    """`trtllm-triton openai ARGS` on a free port, once it answers; yields its base URL (http://...:PORT).
    `admin_key`: the server's, for the repository index it lists the models with; `output` gets what it printed."""
    (port,) = free_ports(1)
    process = subprocess.Popen([sys.executable, "-m", "trtllm_model.launch.cli", "openai", f"--port={port}", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, ADMIN_KEY_ENV: admin_key})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"{base}/health", timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        assert process.wait(30) == -signal.SIGTERM  # uvicorn shuts down, then lets SIGTERM end the process
        if output is not None:
            output.append(process.stdout.read().decode())


def test_one_frontend_for_several_tritons_skips_one_it_cannot_reach(served):
    server = served[0]
    (dead,) = free_ports(1)
    with frontend_alone(f"--triton-url=127.0.0.1:{dead},{server.grpc_url}", "--executor=synthetic",
                        admin_key=server.admin_key) as base:
        client = OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        for _ in range(4):  # the requests take the two URLs in turn
            reply = client.completions.create(model="tensorrt_llm", prompt="abc", max_tokens=3)
            assert reply.choices[0].text == "def"


def test_no_access_log_turns_the_request_log_off(served):
    server = served[0]
    printed: list[str] = []
    with frontend_alone(f"--triton-url={server.grpc_url}", "--executor=synthetic", "--no-access-log",
                        admin_key=server.admin_key, output=printed) as base:
        client = OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        assert client.completions.create(model="tensorrt_llm", prompt="abc", max_tokens=3).choices[0].text == "def"
    assert "ready" in printed[0] and "openai-access" not in printed[0]


def test_frontend_alone_without_a_triton_answers_503():
    (triton_port,) = free_ports(1)
    with frontend_alone(f"--triton-url=127.0.0.1:{triton_port}") as base:
        health = requests.get(f"{base}/health", timeout=5)
        assert health.status_code == 503 and health.json()["error"]["message"] == "Triton is not ready"
        client = OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as unavailable:
            client.chat.completions.create(model="tensorrt_llm", messages=HI)
        assert unavailable.value.status_code == 503 and "not reachable" in unavailable.value.body["message"]


def test_frontend_stops_with_the_server_ending_open_streams(served, client):
    server, base_url = served
    frontends = [p for p in psutil.Process(server.process.pid).children(recursive=True)
                 if "openai" in p.cmdline()]
    assert len(frontends) == 1
    stream = client.chat.completions.create(model="tensorrt_llm", messages=HI, max_tokens=3000, stream=True)
    next(stream)
    stopping = threading.Thread(target=server.stop)
    started = time.monotonic()
    stopping.start()
    with pytest.raises(openai.APIError) as ended:  # the model ends it as it unloads: an SSE error event
        for _ in stream:
            pass
    assert "shutting down" in str(ended.value) and time.monotonic() - started < 20
    stopping.join(60)
    assert server.process.returncode == 0
    assert not frontends[0].is_running()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base_url}/models", timeout=2)
