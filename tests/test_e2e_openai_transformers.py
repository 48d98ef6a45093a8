"""The OpenAI-compatible frontend in front of the embedded transformers executor (SmolLM2-135M-Instruct on CPU),
through the official `openai` client: a real answer, greedy streaming equal to non-streaming, usage counted by
the tokenizer, multi-turn chat through the model's chat template, stop strings and log probabilities."""

from __future__ import annotations

import json
import time

import numpy as np
import openai
import pytest
from openai import OpenAI
from prometheus_text import scrape
from triton_client import stream_once, token_inputs

from trtllm_model.embedded.model_loading import load_tokenizer

pytestmark = pytest.mark.e2e

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
CONVERSATION = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def served(smollm2_openai_server):
    return smollm2_openai_server


@pytest.fixture(scope="module")
def client(served):
    return OpenAI(base_url=served[1], api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def template_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def test_streamed_answer_names_paris(client):
    stream = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=32, stream=True,
                                            **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_greedy_streamed_content_concatenates_to_the_non_streamed(client):
    for messages in (FRANCE, CONVERSATION):
        whole = client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=40, **GREEDY)
        stream = client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=40, stream=True,
                                                **GREEDY)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == whole.choices[0].message.content
    completion = client.completions.create(model="tensorrt_llm", prompt="The three primary colours are", max_tokens=16,
                                           **GREEDY)
    parts = client.completions.create(model="tensorrt_llm", prompt="The three primary colours are", max_tokens=16,
                                      stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in parts) == completion.choices[0].text
    assert completion.usage.completion_tokens == 16 and completion.choices[0].finish_reason == "length"


def test_multi_turn_usage_equals_the_tokenizers_count(client, served, tokenizer):
    reply = client.chat.completions.create(model="tensorrt_llm", messages=CONVERSATION, max_tokens=48, **GREEDY)
    prompt_ids = template_ids(tokenizer, CONVERSATION)
    assert reply.usage.prompt_tokens == len(prompt_ids)
    # The same prompt sent to Triton directly as token ids: the same tokens come back, so the same count.
    direct = stream_once(served[0].grpc_url, "tensorrt_llm", token_inputs(
        prompt_ids, 48, streaming=False, temperature=(0.0, np.float32), end_id=(tokenizer.eos_token_id, np.int32)))
    generated = direct.tokens()
    assert reply.usage.completion_tokens == len(generated)
    assert reply.usage.total_tokens == len(prompt_ids) + len(generated)
    assert reply.choices[0].message.content == tokenizer.decode(generated, skip_special_tokens=True)
    assert "Rome" in reply.choices[0].message.content  # the earlier turns reached the model


def test_stop_string_ends_the_text_before_it(client):
    full = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=32, **GREEDY)
    text = full.choices[0].message.content
    assert "Paris" in text
    cut = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=32, stop=["Paris"], **GREEDY)
    assert cut.choices[0].message.content == text[: text.index("Paris")]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < full.usage.completion_tokens
    streamed = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=32, stop="Paris",
                                              stream=True, **GREEDY)
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text[: text.index("Paris")]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_one_per_token(client):
    reply = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=12, logprobs=True,
                                           **GREEDY)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert all(e.logprob <= 0.0 for e in entries) and any(e.logprob < 0.0 for e in entries)
    assert "".join(e.token for e in entries).startswith(reply.choices[0].message.content[:5])


def test_seeded_sampling_repeats(client):
    runs = [client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=16, temperature=1.0,
                                           seed=1234).choices[0].message.content for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_temperature_samples_and_no_temperature_is_the_models_greedy_default(client):
    story = [{"role": "user", "content": "Tell me a short story about a cat."}]

    def answer(**sampling) -> str:
        reply = client.chat.completions.create(model="tensorrt_llm", messages=story, max_tokens=24, **sampling)
        return reply.choices[0].message.content

    # A temperature samples (top_p 1 unless given): different seeds give different answers.
    assert len({answer(temperature=0.8, seed=seed) for seed in range(4)}) > 1
    # No temperature: the model's default, greedy (as NVIDIA's engines), whatever the seed.
    assert {answer(seed=seed) for seed in range(2)} == {answer(temperature=0)}


def test_model_refusal_is_400_naming_the_parameter(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_completion_tokens=5000)
    assert refused.value.body["param"] == "max_completion_tokens"
    assert "must be at most 4096" in refused.value.body["message"]


def test_a_repeated_prompt_reports_its_cached_prefix_tokens(client):
    """The engine's prefix cache (enable_kv_cache_reuse, blocks of 16 tokens): the second time a long prompt comes,
    usage.prompt_tokens_details.cached_tokens counts the prompt tokens it found cached (whole blocks), as AIPerf
    reads it."""
    messages = [{"role": "system", "content": "You are a careful assistant. " * 12}, *FRANCE]
    first = client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=2, **GREEDY)
    again = client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=2, **GREEDY)
    prompt_tokens = again.usage.prompt_tokens
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < cached
    assert cached % 16 == 0 and prompt_tokens - 16 <= cached < prompt_tokens, (cached, prompt_tokens)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}


def test_parallel_tool_calls_true_with_a_required_call_returns_each_call(client):
    """parallel_tool_calls=true with tool_choice required: the model is held to a list of one or more calls (a JSON
    schema of type array, which the embedded engine's grammar compiles), and each comes back as a tool_calls entry
    whose arguments are the function's. (The guide's shape: test_openai_frontend.py.)"""
    asked = [{"role": "user", "content": "What is the weather in Paris and in Oslo?"}]
    answer = client.chat.completions.create(model="tensorrt_llm", messages=asked, max_tokens=120, tools=[WEATHER_TOOL],
                                            tool_choice="required", parallel_tool_calls=True, **GREEDY)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert choice.message.tool_calls and all(c.function.name == "get_weather" for c in choice.message.tool_calls)
    assert all(set(json.loads(c.function.arguments)) == {"city"} for c in choice.message.tool_calls)


def reused_blocks(server) -> float:
    """The engine's prefix-cache hits since start, in KV blocks (refreshed every stats period; no series before the
    engine's first iteration)."""
    found = scrape(server.metrics_url).find("nv_trt_llm_kv_cache_block_metrics", model="tensorrt_llm",
                                            kv_cache_block_type="reused")
    return sum(found.values())


def test_n_samples_share_the_prompts_cached_blocks(client, served, tokenizer):
    """n > 1: n sequences sampled from one prompt, each seeded from the request's seed (seed + index), so they differ;
    the prompt is prefilled once: the other choices find its full KV blocks cached (the engine's reused-block count
    grows by n - 1 times the prompt's full blocks)."""
    server = served[0]
    messages = [{"role": "system", "content": "You write one line of a poem about the sea, nothing more. " * 5},
                {"role": "user", "content": "A line, please."}]
    prompt_tokens = len(template_ids(tokenizer, messages))
    full_blocks = prompt_tokens // 16
    before = reused_blocks(server)
    reply = client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=12, n=4,
                                           temperature=1.0, seed=11, logprobs=True)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) > 1, texts
    assert reply.usage.prompt_tokens == prompt_tokens
    assert reply.usage.completion_tokens == sum(len(c.logprobs.content) for c in reply.choices)
    deadline = time.monotonic() + 5
    while reused_blocks(server) - before < 3 * full_blocks:
        assert time.monotonic() < deadline, (reused_blocks(server) - before, full_blocks)
        time.sleep(0.1)

    stream = client.chat.completions.create(model="tensorrt_llm", messages=messages, max_tokens=12, n=4,
                                            temperature=1.0, seed=11, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert sorted(c.choices[0].index for c in chunks[:4]) == [0, 1, 2, 3]  # a role chunk per choice first
    finished = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finished == [0, 1, 2, 3] and chunks[-1].usage.prompt_tokens == prompt_tokens
    streamed = ["", "", "", ""]
    for chunk in chunks[:-1]:
        streamed[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert all(streamed) and len(set(streamed)) > 1


def test_top_logprobs_hold_the_sampled_token_with_its_logprob(client):
    """top_logprobs (up to 20) from the engine's own distribution: each entry has that many alternatives, likeliest
    first, and the sampled token's log prob is its entry's; greedy, the likeliest is the token itself."""
    greedy = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=8, logprobs=True,
                                            top_logprobs=5, **GREEDY)
    entries = greedy.choices[0].logprobs.content
    assert len(entries) == greedy.usage.completion_tokens
    for entry in entries:
        assert len(entry.top_logprobs) == 5
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0.0 for v in values)
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
    stream = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=8, logprobs=True,
                                            top_logprobs=5, stream=True, **GREEDY)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, [t.token for t in e.top_logprobs]) for e in entries]

    sampled = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=16, logprobs=True,
                                             top_logprobs=20, temperature=0.7, seed=5)
    found = 0
    for entry in sampled.choices[0].logprobs.content:
        assert len(entry.top_logprobs) == 20
        same = [t.logprob for t in entry.top_logprobs if t.token == entry.token]
        if same:
            assert entry.logprob in same
            found += 1
        else:  # drawn from beyond the 20 likeliest: less likely than each of them
            assert entry.logprob <= entry.top_logprobs[-1].logprob
    assert found >= 8, found  # at temperature 0.7 the sampled token is nearly always among the 20 likeliest

    completion = client.completions.create(model="tensorrt_llm", prompt="The capital of France is", max_tokens=4,
                                           logprobs=3, **GREEDY)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.top_logprobs) == len(logprobs.tokens) == 4
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert len(top) == 3 and top[token] == value


def test_top_logprobs_over_20_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=2, logprobs=True,
                                       top_logprobs=21)
    assert refused.value.body["param"] == "top_logprobs"
