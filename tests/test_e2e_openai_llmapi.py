"""The OpenAI-compatible frontend in front of NVIDIA's LLM API layout (model_repository_llmapi: `text_input`,
`sampling_param_*`, the text so far in `text_output`; the embedded SmolLM2 on CPU), as `make serve LAYOUT=llmapi`
runs it: by default decoupled (with the OpenAI API on, `serve` serves model.yaml's unary model decoupled, so that
streams stream token by token) and unary (`serve --decoupled false`, streams come whole), through the official
`openai` client. e488561 listed no model and answered every request 503 "model 'tensorrt_llm' is not ready
(READY)"."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from trtllm_model.embedded.model_loading import load_tokenizer

pytestmark = pytest.mark.e2e

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module", params=["unary", "decoupled"])
def served(request, llmapi_unary_server, llmapi_stream_server):
    server, base_url = llmapi_unary_server if request.param == "unary" else llmapi_stream_server
    return server, base_url, request.param


@pytest.fixture(scope="module")
def client(served):
    return OpenAI(base_url=served[1], api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_the_llmapi_model_is_listed_and_answers_a_chat(client, tokenizer):
    assert [m.id for m in client.models.list().data] == ["tensorrt_llm"]
    answer = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=24, **GREEDY)
    text = answer.choices[0].message.content
    assert "Paris" in text and answer.choices[0].finish_reason in ("stop", "length")
    prompt = tokenizer.apply_chat_template(FRANCE, tokenize=False, add_generation_prompt=True)
    assert answer.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert answer.usage.completion_tokens == len(tokenizer.encode(text, add_special_tokens=False))
    assert answer.usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_chat_concatenates_to_the_non_streamed(client, served):
    whole = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=24, **GREEDY)
    chunks = list(client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=24, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == whole.choices[0].message.content
    assert len(pieces) > (1 if served[2] == "decoupled" else 0)  # decoupled: token by token; unary: all at once
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_the_start_says_how_streams_come(served):
    """The banner advertises generate_stream only where the model streams, and says why the API's streams come whole
    when it does not."""
    server, _, mode = served
    banner = server.log().split("trtllm-triton: ready")[1]
    if mode == "decoupled":
        assert "serving the LLM API model decoupled, so that the OpenAI API" in server.log()
        assert "/v2/models/tensorrt_llm/generate_stream" in banner and "one chunk" not in banner
    else:
        assert "generate_stream" not in banner
        assert "not decoupled: `stream: true` answers in one chunk" in banner


def test_completions_and_stop_strings(client):
    answer = client.completions.create(model="tensorrt_llm", prompt="The capital of France is", max_tokens=12,
                                       **GREEDY)
    text = answer.choices[0].text
    assert text
    cut = client.completions.create(model="tensorrt_llm", prompt="The capital of France is", max_tokens=12,
                                    stop=[text.strip()[:3]], **GREEDY)
    assert cut.choices[0].finish_reason == "stop" and text.strip()[:3] not in cut.choices[0].text


def test_what_the_llmapi_inputs_cannot_carry_is_a_400_naming_it(client):
    for extra, param in (({"logprobs": True}, "logprobs"), ({"extra_body": {"min_tokens": 3}}, "min_tokens"),
                         ({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=4, **extra)
        assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"
        if "logprobs" in param:  # the layout is named, never "use logprobs=true" for what it refuses anyway
            assert "LLM API" in refused.value.body["message"] and "logprobs=true" not in refused.value.body["message"]


def test_without_max_tokens_the_answer_runs_to_its_end(client):
    """OpenAI's default: as long as the model allows (the context left after the prompt), not the LLM API's 32."""
    answer = client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, **GREEDY)
    assert answer.choices[0].finish_reason == "stop" and "Paris" in answer.choices[0].message.content
