"""What clients used to vLLM's OpenAI server send and expect, through the official `openai` client, in both layouts
(the token-level `tensorrt_llm` and NVIDIA's LLM API model, the embedded SmolLM2): `--served-model-name`,
`max_model_len` in /v1/models, /version, and errors in the API's own names, alike in both layouts."""

from __future__ import annotations

import openai
import pytest
import requests
import transformers
from openai import OpenAI
from openai_server import start_openai_server
from test_e2e_llmapi import copy_repository

from trtllm_model import package_version

pytestmark = pytest.mark.e2e

NAME = "smollm2-135m"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=["inflight_batcher", "llmapi"])
def served(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(f"habits-{request.param}")
    options = {"repository": copy_repository(workdir / "repository")} if request.param == "llmapi" else {}
    server, base_url = start_openai_server(workdir, None, model_id=NAME, serve_args=["--served-model-name", NAME],
                                           **options)
    yield server, base_url
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return OpenAI(base_url=served[1], api_key="none", max_retries=0)


def test_the_model_is_served_under_its_served_name_with_its_length(client, served):
    models = requests.get(f"{served[1]}/models", timeout=30).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [(NAME, 8192)]  # SmolLM2's max_position_embeddings
    answer = client.chat.completions.create(model=NAME, messages=FRANCE, max_tokens=12, temperature=0)
    assert answer.model == NAME and "Paris" in answer.choices[0].message.content
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="tensorrt_llm", messages=FRANCE, max_tokens=4)
    assert unknown.value.body["param"] == "model" and unknown.value.body["code"] == "model_not_found"


def test_version_names_the_project_triton_and_the_engine(served):
    versions = requests.get(served[1].removesuffix("/v1") + "/version", timeout=30).json()
    assert versions == {"version": package_version(), "triton": "2.51.0",
                        "engine": {"executor": "transformers", "library": "transformers",
                                   "version": transformers.__version__}}


def test_n_choices_in_both_layouts(client):
    """n > 1 in either layout: n requests of the one prompt, indexed 0..n-1; greedy, they are alike."""
    answer = client.chat.completions.create(model=NAME, messages=FRANCE, max_tokens=8, temperature=0, n=2)
    assert [c.index for c in answer.choices] == [0, 1]
    assert answer.choices[0].message.content == answer.choices[1].message.content
    single = client.chat.completions.create(model=NAME, messages=FRANCE, max_tokens=8, temperature=0)
    assert single.choices[0].message.content == answer.choices[0].message.content
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (single.usage.prompt_tokens,
                                                                           2 * single.usage.completion_tokens)
    stream = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=6, temperature=0,
                                       n=2, stream=True)
    texts = {0: "", 1: ""}
    for chunk in stream:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts[0] == texts[1] and texts[0]


def test_errors_name_the_api_parameters_the_same_way_in_both_layouts(client, served):
    too_long = [{"role": "user", "content": "Paris " * 10000}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=NAME, messages=too_long, max_tokens=4)
    body = refused.value.body
    assert (body["param"], body["code"], body["type"]) == ("messages", "context_length_exceeded",
                                                           "invalid_request_error")
    assert "input_ids" not in body["message"]

    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=NAME, prompt="Paris", max_tokens=4, stop=["a", "b", "c", "d", "e"])
    assert refused.value.body["param"] == "stop" and "Value error" not in refused.value.body["message"]

    for wrong_method in (requests.get(f"{served[1]}/chat/completions", timeout=30),
                         requests.post(f"{served[1]}/models", timeout=30)):
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"]["type"] == "invalid_request_error"
