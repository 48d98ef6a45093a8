"""Structured output against a real tritonserver with the embedded SmolLM2 (issue 25): NVIDIA's guided decoding
inputs through `tensorrt_llm` (token ids) and `ensemble` (text), and OpenAI's `response_format` and `tools` through
the frontend with the official `openai` client. JSON is validated against its schema with `jsonschema`; a regex
must match the whole output."""

from __future__ import annotations

import json
import re
import string
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import numpy as np
import openai
import pytest
from conftest import start_server
from openai import OpenAI
from triton_client import StreamClient, stream_once, text_inputs, token_inputs

from trtllm_model.embedded.model_loading import load_tokenizer

pytestmark = pytest.mark.e2e

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0},
                   "country": {"type": "string", "maxLength": 20}},
    "required": ["city", "population", "country"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 24},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string", "maxLength": 24}}, "required": ["timezone"],
    "additionalProperties": False}}}
PARIS = [{"role": "user", "content": "Give me facts about Paris as JSON."}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def served(smollm2_openai_server):
    return smollm2_openai_server


@pytest.fixture(scope="module")
def client(served):
    return OpenAI(base_url=served[1], api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def guide_inputs(guide_type: str, guide: str | None) -> dict:
    extra = {"guided_decoding_guide_type": ([[guide_type.encode()]], np.object_)}
    if guide is not None:
        extra["guided_decoding_guide"] = ([[guide.encode()]], np.object_)
    return extra


def chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


REGEX = r"[A-Z][a-z]{2,12}, [A-Z]{2}"
GRAMMAR = 'root ::= "The answer is " ("yes" | "no") "."'
GUIDES = {"json": None, "json_schema": json.dumps(CITY), "regex": REGEX, "ebnf_grammar": GRAMMAR}


def assert_follows(guide_type: str, text: str) -> None:
    if guide_type == "json":
        json.loads(text)
    elif guide_type == "json_schema":
        jsonschema.validate(json.loads(text), CITY)
    elif guide_type == "regex":
        assert re.fullmatch(REGEX, text), text
    else:
        assert re.fullmatch(r"The answer is (yes|no)\.", text), text


@pytest.mark.parametrize("guide_type", list(GUIDES))
def test_nvidia_guide_inputs_through_tensorrt_llm_and_ensemble(served, tokenizer, guide_type):
    server, _ = served
    question = "Tell me about Paris, the capital of France."
    guide = guide_inputs(guide_type, GUIDES[guide_type])
    tokens = stream_once(server.grpc_url, "tensorrt_llm", token_inputs(
        chat_ids(tokenizer, question), 96, end_id=(tokenizer.eos_token_id, np.int32),
        return_finish_reason=(True, np.bool_), **guide), timeout_s=180)
    assert not tokens.errors, tokens.errors
    assert_follows(guide_type, tokenizer.decode(tokens.tokens()))
    assert tokens.responses[-1].as_numpy("finish_reason").reshape(-1)[0] == b"end_id"  # the grammar ended it

    text = stream_once(server.grpc_url, "ensemble", text_inputs(
        question, 96, apply_chat_template=(True, np.bool_), **guide), timeout_s=180)
    assert not text.errors, text.errors
    assert_follows(guide_type, text.text())


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
def test_a_guide_that_does_not_compile_is_invalid_arg_with_the_compilers_message(served, tokenizer, model):
    server, _ = served
    guide = guide_inputs("json_schema", '{"type": "bogus"}')
    inputs = (token_inputs([1, 2, 3], 4, **guide) if model == "tensorrt_llm"
              else text_inputs("hi", 4, **guide))
    result = stream_once(server.grpc_url, model, inputs)
    assert len(result.errors) == 1 and result.finals == 1
    assert result.errors[0].startswith("INVALID_ARG") or "INVALID_ARG: " in result.errors[0]
    assert "guided_decoding_guide" in result.errors[0] and 'Unsupported type "bogus"' in result.errors[0]


def test_a_hostile_guide_is_invalid_arg_naming_the_limit_and_the_server_keeps_serving(served, client, tokenizer):
    """Guides from untrusted clients: one over max_guide_bytes (64 KiB), and a JSON-schema pattern whose nested
    counts took 102 s to compile with xgrammar here, are refused at once; guided requests go on being served."""
    server, _ = served
    huge = guide_inputs("regex", "a" * (64 * 1024 + 1))
    refused = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 2, 3], 4, **huge), timeout_s=30)
    assert len(refused.errors) == 1 and refused.finals == 1
    assert refused.errors[0].startswith("INVALID_ARG") or "INVALID_ARG: " in refused.errors[0]
    assert "guided_decoding_guide" in refused.errors[0] and "over max_guide_bytes=65536" in refused.errors[0]

    slow = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^([a-z]{1,30}){1,30}$"}}}
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tensorrt_llm", messages=PARIS, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": slow}}, timeout=30)
    assert bad.value.body["param"] == "response_format" and "nested counts multiply to 900" in bad.value.body["message"]

    tokens = stream_once(server.grpc_url, "tensorrt_llm", token_inputs(
        chat_ids(tokenizer, "Tell me about Paris."), 96, end_id=(tokenizer.eos_token_id, np.int32),
        **guide_inputs("regex", REGEX)), timeout_s=180)
    assert not tokens.errors, tokens.errors
    assert_follows("regex", tokenizer.decode(tokens.tokens()))


# -- the engine in its worker process (engine_process=true): the worker compiles guides, once, off its command loop --
@pytest.fixture(scope="module")
def worker_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("guided-worker"), executor="transformers", parameters={
        "engine_process": "true", "max_batch_size": "4", "guide_compile_timeout_s": "1"})
    yield server
    server.stop()


def slow_schema(max_length: int, properties: int = 1) -> str:
    """Passes the guide checks and compiles in about 1.4 s a property on 2 quiet cores, longer under load (a distinct
    guide per max_length). Each property has a maxLength of its own: xgrammar compiles identical ones once (three
    properties of one maxLength took 1.4 s, as one did)."""
    names = ["note", *(f"note{i}" for i in range(1, properties))]
    return json.dumps({"type": "object", "properties": {name: {"type": "string", "maxLength": max_length + 10 * i}
                                                        for i, name in enumerate(names)}, "required": names})


def refused_in(server, guide: str) -> float:
    """Seconds until the guided request was refused: INVALID_ARG naming the compile timeout (sent again, as a client
    would, while the compiler is busy with an earlier test's slow guide: UNAVAILABLE, retry later)."""
    deadline = time.monotonic() + 120
    while True:
        started = time.monotonic()
        result = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 2, 3], 4, **guide_inputs(
            "json_schema", guide)), timeout_s=60)
        seconds = time.monotonic() - started
        if not (result.errors and "guide compiler is busy" in result.errors[0]) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(result.errors) == 1 and result.finals == 1, result.errors
    assert result.errors[0].startswith("INVALID_ARG") and "guide_compile_timeout_s=1 s" in result.errors[0]
    return seconds


def test_in_the_worker_unguided_requests_are_answered_while_a_slow_guide_compiles(worker_server):
    client = StreamClient(worker_server.grpc_url)
    try:
        # Three properties: about 4 s of compilation, so the requests below end well within it on a loaded machine.
        guide = slow_schema(301, properties=3)
        guided = client.send("tensorrt_llm", token_inputs([1, 2, 3], 4, **guide_inputs("json_schema", guide)), "g")
        time.sleep(0.2)  # it reaches the worker's compiler first
        unguided = [client.send("tensorrt_llm", token_inputs([1, 504, 3575 + i], 2), f"u{i}") for i in range(3)]
        for result in unguided:
            result.wait(30)
            assert result.errors == [] and result.finals == 1 and len(result.tokens()) == 2
        # The compilation is still under way after those three: a resend waits the whole second for it.
        assert refused_in(worker_server, guide) >= 0.8
        guided.wait(30)
        assert guided.errors and "guide_compile_timeout_s=1 s" in guided.errors[0]
    finally:
        client.close()


def test_in_the_worker_a_guide_that_timed_out_is_refused_again_within_the_bound(worker_server, tokenizer):
    guide = slow_schema(302)
    assert refused_in(worker_server, guide) < 4.0
    # Sent again while it compiles, and after: refused again each time, within the bound, never served; once the
    # compilation has ended the kept refusal comes at once.
    deadline = time.monotonic() + 120
    while refused_in(worker_server, guide) >= 0.5:
        assert time.monotonic() < deadline, "the compilation never ended"
    tokens = stream_once(worker_server.grpc_url, "tensorrt_llm", token_inputs(
        chat_ids(tokenizer, "Tell me about Paris."), 96, end_id=(tokenizer.eos_token_id, np.int32),
        **guide_inputs("regex", REGEX)), timeout_s=180)
    assert not tokens.errors, tokens.errors  # a guide within the bound is served
    assert_follows("regex", tokenizer.decode(tokens.tokens()))


# -- one client's guides cost another nothing: grammars kept by bytes, a bounded and fair compile pool -------------
@pytest.fixture(scope="module")
def bounded_server(tmp_path_factory):
    """The CPU layout (the stub compiles guides) with a 40-request bound, and 4 MiB for kept grammars (1 MiB a guide)."""
    server = start_server(tmp_path_factory.mktemp("guided-bounds"), executor="transformers", parameters={
        "max_batch_size": "8", "max_queue_size": "32", "guide_compile_timeout_s": "5",
        "max_guide_cache_bytes": str(4 << 20)})
    yield server
    server.stop()


def test_a_guide_whose_grammar_is_over_its_share_of_the_cache_is_refused_and_not_kept(bounded_server, tokenizer):
    """A 13-byte regex compiles to 1.6 MiB (an allowed 896-byte one to about 60 MiB, and 40 of them held 2.5 GiB in
    the stub's cache): over a quarter of max_guide_cache_bytes it is refused, sent again too, and not kept."""
    for _ in range(2):
        result = stream_once(bounded_server.grpc_url, "tensorrt_llm", token_inputs(
            [1, 2, 3], 4, **guide_inputs("regex", "[a-z ]{10000}")), timeout_s=120)
        assert len(result.errors) == 1 and result.finals == 1, result.errors
        assert "INVALID_ARG" in result.errors[0] and "over the 1 MiB one compiled guide may take" in result.errors[0]
    tokens = stream_once(bounded_server.grpc_url, "tensorrt_llm", token_inputs(
        chat_ids(tokenizer, "Tell me about Paris."), 96, end_id=(tokenizer.eos_token_id, np.int32),
        **guide_inputs("regex", REGEX)), timeout_s=180)
    assert not tokens.errors, tokens.errors
    assert_follows("regex", tokenizer.decode(tokens.tokens()))


def test_a_385_byte_regex_whose_grammar_takes_47_mib_is_refused_by_the_default_bound(served):
    """An alternation of 48 `[^X]{8}` classes passes the guide checks and compiles to about 47.5 MiB in 1.5 s: over
    the 16 MiB a guide may take by default (a quarter of max_guide_cache_bytes, 64 MiB). Kept, 40 of them took 1.9 GiB."""
    server, _ = served
    alternation = "(" + "|".join(f"[^{c}]{{8}}" for c in string.ascii_letters[1:49]) + ")"
    result = stream_once(server.grpc_url, "tensorrt_llm", token_inputs(
        [1, 2, 3], 1, **guide_inputs("regex", alternation)), timeout_s=120)
    assert len(result.errors) == 1 and result.finals == 1, result.errors
    assert "INVALID_ARG" in result.errors[0] and "over the 16 MiB one compiled guide may take" in result.errors[0]


def test_forty_slow_guides_leave_room_for_a_small_guide_and_an_unguided_request(bounded_server, tokenizer):
    """Forty distinct slow guides (each about 1.4 s to compile) against a 40-request bound filled it and an unguided
    request was refused `queue full`; a `[0-9]+` guide behind them was refused for the compile timeout (its wait in the
    queue counted). Now the slow ones take at most 2 threads and 8 queue places (the rest: UNAVAILABLE at once), and
    the small guide compiles on a thread of its own."""
    client = StreamClient(bounded_server.grpc_url)
    try:
        slow = [client.send("tensorrt_llm", token_inputs([1, 2, 3], 4, **guide_inputs(
            "json_schema", slow_schema(400 + n))), f"slow{n}") for n in range(40)]
        time.sleep(0.5)
        digits = client.send("tensorrt_llm", token_inputs(chat_ids(tokenizer, "How many moons has Mars?"), 4, **guide_inputs(
            "regex", "[0-9]+")), "digits")
        unguided = client.send("tensorrt_llm", token_inputs([1, 504, 3575], 2), "unguided")
        for result in (unguided, digits):
            result.wait(120)
            assert result.errors == [] and result.finals == 1, result.errors
        assert len(unguided.tokens()) == 2 and re.fullmatch("[0-9]+", tokenizer.decode(digits.tokens()))
        for result in slow:
            result.wait(120)
            assert result.finals == 1
        busy = [r for r in slow if r.errors and "UNAVAILABLE" in r.errors[0] and "guide compiler is busy" in r.errors[0]]
        assert len(busy) >= 30, [r.errors for r in slow]  # at most 2 compiling, 8 queued
    finally:
        client.close()


@pytest.mark.parametrize("stream", [False, True])
def test_openai_strict_json_schema_validates(client, stream):
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    kwargs = {"model": "tensorrt_llm", "messages": PARIS, "max_tokens": 120, "response_format": response_format}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        completion = client.chat.completions.create(**kwargs)
        text, finish = completion.choices[0].message.content, [completion.choices[0].finish_reason]
    jsonschema.validate(json.loads(text), CITY)
    assert finish == ["stop"]


def test_openai_json_object_is_json(client):
    messages = [{"role": "user", "content": "Tell me about Paris, the capital of France."}]
    completion = client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=200,
                                                response_format={"type": "json_object"})
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(completion.choices[0].message.content), dict | list)


def test_openai_bad_schema_is_400_with_the_compilers_message(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tensorrt_llm", messages=PARIS, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}})
    error = refused.value.body
    assert error["param"] == "response_format" and 'Unsupported type "bogus"' in error["message"]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_openai_tool_choice_forcing_a_call_returns_a_call_whose_arguments_validate(client, tool_choice):
    completion = client.chat.completions.create(model="tensorrt_llm", messages=ASK_WEATHER, max_tokens=80,
                                                tools=[WEATHER, TIME], tool_choice=tool_choice)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    if tool_choice != "required":
        assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_openai_tool_calls_stream_as_openai_deltas(client):
    chunks = list(client.chat.completions.create(model="tensorrt_llm", messages=ASK_WEATHER, max_tokens=80,
                                                 tools=[WEATHER], tool_choice="required", stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert {d.index for d in deltas} == {0}
    arguments = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_openai_auto_tools_answer_is_content_or_valid_calls_and_the_conversation_goes_on(client):
    completion = client.chat.completions.create(model="tensorrt_llm", messages=ASK_WEATHER, max_tokens=80,
                                                tools=[WEATHER])
    message = completion.choices[0].message
    for call in message.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert message.tool_calls or message.content
    # The client answers a call; the conversation with the call and its result goes back to the model.
    follow_up = [*ASK_WEATHER,
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                     "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    answer = client.chat.completions.create(model="tensorrt_llm", messages=follow_up, max_tokens=24,
                                            tools=[WEATHER], tool_choice="none")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


# -- the parameters benchmark clients send (issue 25.3) --------------------------------------------------------------

def test_ignore_eos_generates_max_tokens_and_min_tokens_holds_the_end_back(client):
    """A greedy answer to 'hi' ends after a few tokens; with ignore_eos it runs to max_tokens (guidellm's
    fixed-length runs), with min_tokens at least that far."""
    hi = [{"role": "user", "content": "hi"}]
    free = client.chat.completions.create(model="tensorrt_llm", messages=hi, max_tokens=160, temperature=0)
    assert free.usage.completion_tokens < 100 and free.choices[0].finish_reason == "stop"
    # The two long answers share the engine's batch (their lengths do not depend on near-ties); the free one went
    # alone, as batch neighbours may move a bfloat16 near-tie.
    with ThreadPoolExecutor(2) as pool:
        fixed, floor = pool.map(lambda extra: client.chat.completions.create(
            model="tensorrt_llm", messages=hi, max_tokens=160, temperature=0, extra_body=extra),
            [{"ignore_eos": True}, {"min_tokens": 100}])
    assert fixed.usage.completion_tokens == 160 and fixed.choices[0].finish_reason == "length"
    assert floor.usage.completion_tokens >= 100


def test_top_p_0_is_accepted_as_greedy(client):
    kwargs = {"model": "tensorrt_llm", "messages": PARIS, "max_tokens": 12}
    greedy = client.chat.completions.create(temperature=0, **kwargs).choices[0].message.content
    assert client.chat.completions.create(top_p=0, temperature=0.9, **kwargs).choices[0].message.content == greedy


def test_at_most_four_stop_strings(client):
    client.chat.completions.create(model="tensorrt_llm", messages=PARIS, max_tokens=4, stop=["a", "b", "c", "d"])
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tensorrt_llm", messages=PARIS, max_tokens=4,
                                       stop=["a", "b", "c", "d", "e"])
    assert refused.value.body["param"] == "stop"


def test_an_over_long_prompt_is_context_length_exceeded(client):
    """Over the engine's max_input_len (4096 tokens of prompt; longer than max_num_tokens is prefilled in chunks);
    the other engines' words for it are mapped too (tests/test_openai_frontend.py)."""
    messages = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=16)
    assert refused.value.code == "context_length_exceeded", refused.value.message
    assert refused.value.body["param"] == "messages"
