"""One request must never kill the engine (issue 21): hypothesis-generated requests, odd values, dtypes and shapes,
against a real tritonserver serving the embedded transformers executor (the one a bad end_id killed).

Every request must end with exactly one final response (tokens or an error, within a timeout); no error may say the
model is unavailable or failed inside; afterwards the model is still ready and still answers a normal request.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from triton_client import StreamClient, token_inputs
from tritonclient.utils import np_to_triton_dtype

from trtllm_model.conventions.inflight_batcher import words_to_offsets

pytestmark = pytest.mark.e2e

VOCAB = 49152  # SmolLM2's
REQUEST_TIMEOUT_S = 60
# A failure of one request may name only that request's fault; these say the model itself failed.
MODEL_FAILURES = ("UNAVAILABLE", "INTERNAL")
# No shrinking: after a failure the server is what it is, and replays would only measure the wreck.
FUZZ = settings(deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def server(smollm2_server):
    return smollm2_server


def _http(server, path: str, body: dict | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.http_url + path, data=data, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    infer_input = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    infer_input.set_data_from_numpy(array)
    return infer_input


# Outcomes by model: a fuzz whose requests all fail at the edge would test nothing past it.
OUTCOMES: dict[str, Counter] = {"tensorrt_llm": Counter(), "ensemble": Counter()}


def _send_together(server, model: str, requests: list[dict[str, np.ndarray]]) -> None:
    """Send requests at once (odd ones batched with plausible ones, as one engine step may hold them); assert each
    ends with exactly one final response and no model failure, and the model is still ready."""
    client = StreamClient(server.grpc_url)
    try:
        results = [client.send(model, [_input(name, array) for name, array in arrays.items()], f"fuzz{i}")
                   for i, arrays in enumerate(requests)]
        for arrays, result in zip(requests, results, strict=True):
            assert result.done.wait(REQUEST_TIMEOUT_S), f"no final response within {REQUEST_TIMEOUT_S} s: {arrays}"
        time.sleep(0.05)  # a second final would arrive right behind the first
        for arrays, result in zip(requests, results, strict=True):
            assert result.finals == 1, f"{result.finals} final responses: {arrays}"
            for error in result.errors:
                assert not error.startswith(MODEL_FAILURES), f"{error}\nfor {arrays}"
            OUTCOMES[model]["refused" if result.errors else "served"] += 1
    finally:
        client.close()
    assert _http(server, "/v2/models/tensorrt_llm/ready")[0] == 200, f"model not ready after {requests}"


# -- values: each request is plausible but for at most a few fields, which get the edges an engine indexes or sizes
# with, odd dtypes or odd shapes (a request odd everywhere would only ever meet the first check) -------------------
GOOD_TOKEN = st.integers(0, 600)
# Most dangerous first: hypothesis draws the first values of a list more often.
ODD_TOKEN = st.sampled_from([100000, VOCAB, 2**31 - 1, -2, VOCAB - 1, -1, -(2**31)])
ODD_COUNT = st.sampled_from([2**31 - 1, 100000, 9000, -1, 0])
ODD_FLOAT = st.sampled_from([float("nan"), float("inf"), 1e30, 1e-30, -1e30, -1.0, -float("inf")])
ID_INPUTS = frozenset({"end_id", "pad_id"})
ODD_DTYPE = st.sampled_from([np.int64, np.float32, np.uint64, np.int8, np.float64])


def _scalar(value, dtype=np.int32) -> np.ndarray:
    return np.array([[value]]).astype(dtype)


def _odd_scalar(draw, name: str, good: np.ndarray) -> np.ndarray:
    """One odd thing about a one-value input: mostly its value (an id past the vocabulary for ids), else its dtype
    or its shape."""
    how = draw(st.sampled_from(["value", "value", "value", "dtype", "shape"]))
    if how == "dtype":
        return good.astype(draw(ODD_DTYPE))
    if how == "shape":
        return np.repeat(good, draw(st.sampled_from([0, 2])), axis=1)
    if good.dtype == np.float32:
        return _scalar(draw(ODD_FLOAT), np.float32)
    return _scalar(draw(ODD_TOKEN if name in ID_INPUTS else ODD_COUNT), good.dtype)


def _words(draw, odd: bool) -> np.ndarray:
    token = st.one_of(GOOD_TOKEN, ODD_TOKEN) if odd else GOOD_TOKEN
    words = words_to_offsets(draw(st.lists(st.lists(token, min_size=1, max_size=3), min_size=1, max_size=3)))
    if odd and draw(st.booleans()):  # malformed offsets or shape
        return draw(st.sampled_from([words[:, :, ::-1].copy(), words[:, :1], words.astype(np.int64)]))
    return words


def _bias(draw, odd: bool) -> np.ndarray:
    bias = np.zeros((1, VOCAB), np.float32)
    bias[0, draw(GOOD_TOKEN)] = draw(st.sampled_from([5.0, -5.0, -float("inf")]))
    if odd:
        if draw(st.booleans()):
            return bias[:, : draw(st.sampled_from([0, 3, VOCAB - 1]))]
        bias[0, draw(st.integers(0, VOCAB - 1))] = draw(ODD_FLOAT)
    return bias


# One-value inputs of the token-level model: the value a client would send.
TOKEN_SCALARS = {
    "end_id": st.one_of(GOOD_TOKEN, st.just(-1)).map(_scalar),
    "pad_id": GOOD_TOKEN.map(_scalar),
    "min_tokens": st.integers(0, 4).map(_scalar),
    "runtime_top_k": st.integers(0, 50).map(_scalar),
    "beam_width": st.integers(0, 1).map(_scalar),
    "num_return_sequences": st.integers(0, 1).map(_scalar),
    "allotted_time_ms": st.integers(1, 5000).map(_scalar),
    "seed": st.integers(0, 2**64 - 1).map(lambda v: _scalar(v, np.uint64)),
    "temperature": st.sampled_from([0.0, 0.5, 1.0, 1.3]).map(lambda v: _scalar(v, np.float32)),
    "runtime_top_p": st.sampled_from([0.0, 0.5, 0.9, 1.0]).map(lambda v: _scalar(v, np.float32)),
    "repetition_penalty": st.sampled_from([1.0, 1.3]).map(lambda v: _scalar(v, np.float32)),
    "presence_penalty": st.sampled_from([0.0, 0.5, -0.5]).map(lambda v: _scalar(v, np.float32)),
    "frequency_penalty": st.sampled_from([0.0, 0.5, -0.5]).map(lambda v: _scalar(v, np.float32)),
    "len_penalty": st.sampled_from([0.0, 1.0]).map(lambda v: _scalar(v, np.float32)),
}
FLAGS = ("streaming", "return_log_probs", "return_context_logits", "return_generation_logits",
         "exclude_input_in_output", "return_finish_reason", "return_perf_metrics")
# The fields a request gets odd: the id-valued ones (the engine indexes with them) three times as often.
ID_FIELDS = ["end_id", "bad_words_list", "input_ids", "pad_id", "stop_words_list", "embedding_bias"]
TOKEN_FIELDS = [*ID_FIELDS * 3, "request_output_len", *(name for name in TOKEN_SCALARS if name not in ID_FIELDS)]


@st.composite
def token_requests(draw) -> dict[str, np.ndarray]:
    odd = draw(st.sets(st.sampled_from(TOKEN_FIELDS), max_size=3))
    ids = draw(st.lists(GOOD_TOKEN, min_size=1, max_size=8))
    if "input_ids" in odd:
        ids = draw(st.lists(st.one_of(GOOD_TOKEN, ODD_TOKEN), min_size=0, max_size=8))
    arrays = {"input_ids": np.array([ids], np.int32)}
    if "input_ids" in odd and draw(st.booleans()):
        arrays["input_ids"] = draw(st.sampled_from([arrays["input_ids"].astype(np.int64), np.zeros((2, 2), np.int32),
                                                    arrays["input_ids"].reshape(-1)]))
    arrays["request_output_len"] = _scalar(draw(st.integers(1, 3)))
    if "request_output_len" in odd:
        arrays["request_output_len"] = _odd_scalar(draw, "request_output_len", arrays["request_output_len"])
    for name in ("stop_words_list", "bad_words_list"):
        if name in odd or draw(st.integers(0, 4)) == 0:
            arrays[name] = _words(draw, name in odd)
    if "embedding_bias" in odd or draw(st.integers(0, 9)) == 0:
        arrays["embedding_bias"] = _bias(draw, "embedding_bias" in odd)
    for name, good in TOKEN_SCALARS.items():
        if name in odd:
            arrays[name] = _odd_scalar(draw, name, draw(good))
        elif draw(st.booleans()):
            arrays[name] = draw(good)
    for name in FLAGS:
        if draw(st.booleans()):
            arrays[name] = _scalar(draw(st.booleans()), np.bool_)
    return arrays


GOOD_TEXT = st.sampled_from(["Hi", "What is 2+2?", "Écris ☕ 東京", "🙂🙂", "a\u0301\u200d\ufeff", "\r\n\t x"])
ODD_TEXT = st.one_of(st.text(max_size=30), st.sampled_from(["", "\x00", "\ud800", "\U0010ffff" * 5, "🙂" * 200]))


def _strings(texts: list[str]) -> np.ndarray:
    # surrogatepass: hypothesis makes lone surrogates, which are not UTF-8 (the model must say so, not fail).
    return np.array([[t.encode("utf-8", "surrogatepass") for t in texts]], np.object_)


TEXT_SCALARS = {
    "end_id": st.one_of(GOOD_TOKEN, st.just(-1)).map(_scalar),
    "min_tokens": st.integers(0, 4).map(_scalar),
    "top_k": st.integers(0, 50).map(_scalar),
    "temperature": st.sampled_from([0.0, 0.7]).map(lambda v: _scalar(v, np.float32)),
    "top_p": st.sampled_from([0.0, 0.9]).map(lambda v: _scalar(v, np.float32)),
    "apply_chat_template": st.booleans().map(lambda v: _scalar(v, np.bool_)),
}
TEXT_FIELDS = ["text_input", "max_tokens", "stop_words", "bad_words", "embedding_bias_words", *TEXT_SCALARS]


@st.composite
def text_requests(draw) -> dict[str, np.ndarray]:
    odd = draw(st.sets(st.sampled_from(TEXT_FIELDS), max_size=2))
    text = st.one_of(GOOD_TEXT, ODD_TEXT) if "text_input" in odd else GOOD_TEXT
    arrays = {"text_input": _strings([draw(text)]), "max_tokens": _scalar(draw(st.integers(1, 3))),
              "stream": _scalar(draw(st.booleans()), np.bool_)}
    if "text_input" in odd and draw(st.integers(0, 3)) == 0:
        arrays["text_input"] = np.array([[b"\xff\xfe"]], np.object_)
    if "max_tokens" in odd:
        arrays["max_tokens"] = _odd_scalar(draw, "max_tokens", arrays["max_tokens"])
    for name in ("stop_words", "bad_words", "embedding_bias_words"):
        if name in odd or draw(st.integers(0, 3)) == 0:
            words = st.one_of(GOOD_TEXT, ODD_TEXT) if name in odd else GOOD_TEXT
            arrays[name] = _strings(draw(st.lists(words, min_size=1, max_size=3)))
    if "embedding_bias_words" in arrays:
        count = arrays["embedding_bias_words"].shape[1] + ("embedding_bias_words" in odd and draw(st.integers(0, 1)))
        weight = st.one_of(st.just(2.0), ODD_FLOAT) if "embedding_bias_words" in odd else st.just(2.0)
        arrays["embedding_bias_weights"] = np.array([[draw(weight) for _ in range(count)]], np.float32)
    for name, good in TEXT_SCALARS.items():
        if name in odd:
            arrays[name] = _odd_scalar(draw, name, draw(good))
        elif draw(st.integers(0, 3)) == 0:
            arrays[name] = draw(good)
    return arrays


# Guided requests with everything else that shapes which token may come next: bans (bad words), embedding bias,
# stop words and min_tokens, over guides whose first tokens are few. The bans and biases draw on the tokens the
# guide allows first (some of them, or all: the edge where nothing is left).
GUIDES = [("regex", "[0-9]"), ("regex", "(yes|no)"), ("ebnf_grammar", 'root ::= ("a" | "b") " " [0-9]{1,3}')]
_ALLOWED: dict[tuple[str, str], list[int]] = {}


def guide_first_tokens(guide: tuple[str, str]) -> list[int]:
    """The tokens `guide` allows first (computed once per guide, with the server's tokenizer)."""
    if guide not in _ALLOWED:
        from trtllm_model.embedded.guided import GuideCompiler, mask_guided_logits
        from trtllm_model.embedded.model_loading import load_tokenizer

        tokenizer = load_tokenizer()
        compiler = GuideCompiler(tokenizer, VOCAB, [tokenizer.eos_token_id])
        logits = torch.zeros(1, VOCAB)
        mask_guided_logits(logits, [compiler.matcher(compiler.compile(*guide), None)])
        _ALLOWED[guide] = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    return _ALLOWED[guide]


def _guided_tokens(draw, allowed: list[int]) -> list[int]:
    how = draw(st.sampled_from(["all", "some", "other"]))
    if how == "all":
        return allowed
    if how == "some":
        return draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=len(allowed), unique=True))
    return draw(st.lists(GOOD_TOKEN, min_size=1, max_size=3))


@st.composite
def guided_requests(draw) -> dict[str, np.ndarray]:
    guide = draw(st.sampled_from(GUIDES))
    allowed = guide_first_tokens(guide)
    arrays = {"input_ids": np.array([draw(st.lists(GOOD_TOKEN, min_size=1, max_size=8))], np.int32),
              "request_output_len": _scalar(draw(st.integers(1, 4))),
              "guided_decoding_guide_type": np.array([[guide[0].encode()]], np.object_),
              "guided_decoding_guide": np.array([[guide[1].encode()]], np.object_)}
    if draw(st.booleans()):
        arrays["bad_words_list"] = words_to_offsets([[token] for token in _guided_tokens(draw, allowed)])
    if draw(st.booleans()):
        bias = np.zeros((1, VOCAB), np.float32)
        bias[0, _guided_tokens(draw, allowed)] = draw(st.sampled_from([-np.inf, -5.0, 5.0]))
        arrays["embedding_bias"] = bias
    if draw(st.booleans()):
        arrays["stop_words_list"] = words_to_offsets([[token] for token in _guided_tokens(draw, allowed)])
    if draw(st.booleans()):
        arrays["min_tokens"] = _scalar(draw(st.integers(0, 4)))
    for name in ("streaming", "return_log_probs"):
        if draw(st.booleans()):
            arrays[name] = _scalar(draw(st.booleans()), np.bool_)
    return arrays


# -- tests --------------------------------------------------------------------------------------------------------------
def test_an_end_id_outside_the_vocabulary_is_invalid_arg_and_the_model_keeps_serving(server):
    """Issue 21's request: it answered UNAVAILABLE (IndexError in the engine) and the model unloaded itself."""
    status, body = _http(server, "/v2/models/tensorrt_llm/generate",
                         {"input_ids": [1, 2], "request_output_len": 4, "end_id": 100000, "min_tokens": 2})
    assert status == 400 and "INVALID_ARG: end_id=100000: must be within [0, 49152)" in body, (status, body)
    assert _http(server, "/v2/models/tensorrt_llm/ready")[0] == 200
    status, body = _http(server, "/v2/models/tensorrt_llm/generate", {"input_ids": [1, 2], "request_output_len": 2})
    assert status == 200 and len(json.loads(body)["output_ids"]) == 2, body


DIGIT_GUIDE = {"guided_decoding_guide_type": ([[b"regex"]], np.object_),
               "guided_decoding_guide": ([[b"[0-9]"]], np.object_)}


def test_twelve_guided_requests_that_ban_every_allowed_token_are_invalid_arg_and_the_model_keeps_serving(server):
    """Issue 31: the sampler answered token 0, the grammar refused it, and eight such failures in a row stopped the
    engine for everyone. Each now ends with its own INVALID_ARG; the model stays ready and answers."""
    digit_tokens = guide_first_tokens(("regex", "[0-9]"))
    bias = np.zeros((1, VOCAB), np.float32)
    bias[0, digit_tokens] = -np.inf
    bans = {"bad_words_list": (words_to_offsets([[token] for token in digit_tokens]), np.int32)}
    client = StreamClient(server.grpc_url)
    try:
        for i in range(12):
            ban = bans if i % 2 == 0 else {"embedding_bias": (bias, np.float32)}
            result = client.send("tensorrt_llm", token_inputs([1, 504 + i], 4, **DIGIT_GUIDE, **ban), f"ban{i}")
            result.wait(REQUEST_TIMEOUT_S)
            assert result.finals == 1 and result.tokens() == [], (i, result.errors)
            assert len(result.errors) == 1 and result.errors[0].startswith("INVALID_ARG"), result.errors
            assert "no token is allowed" in result.errors[0]
        answer = client.send("tensorrt_llm", token_inputs([1, 504], 3, **DIGIT_GUIDE), "digit").wait(REQUEST_TIMEOUT_S)
        plain = client.send("tensorrt_llm", token_inputs([1, 504], 3, min_tokens=(3, np.int32)), "plain")
        plain.wait(REQUEST_TIMEOUT_S)
    finally:
        client.close()
    assert answer.errors == [] and answer.tokens() and all(token in digit_tokens for token in answer.tokens()[:1])
    assert plain.errors == [] and len(plain.tokens()) == 3
    assert _http(server, "/v2/models/tensorrt_llm/ready")[0] == 200


@settings(FUZZ, max_examples=25)
@given(requests=st.lists(token_requests(), min_size=1, max_size=4))
def test_token_level_fuzz_never_kills_the_model(server, requests):
    _send_together(server, "tensorrt_llm", requests)


@settings(FUZZ, max_examples=20)
@given(requests=st.lists(guided_requests(), min_size=1, max_size=4))
def test_guided_fuzz_with_bans_bias_stop_words_and_min_tokens_never_fails_the_model(server, requests):
    """A combination the engine cannot meet (the guide allows only what the request bans) is the request's own
    INVALID_ARG; nothing here may answer INTERNAL or stop the model (issue 31)."""
    _send_together(server, "tensorrt_llm", requests)


@settings(FUZZ, max_examples=15)
@given(requests=st.lists(text_requests(), min_size=1, max_size=4))
def test_text_level_fuzz_never_kills_the_model(server, requests):
    _send_together(server, "ensemble", requests)


def test_after_the_fuzz_the_model_is_ready_and_serves(server):
    for model, outcomes in OUTCOMES.items():  # both kinds of request reached the engine, and were refused
        assert outcomes["served"] >= 5 and outcomes["refused"] >= 5, (model, outcomes)
    assert _http(server, "/v2/models/tensorrt_llm/ready")[0] == 200
    assert _http(server, "/v2/models/ensemble/ready")[0] == 200
    client = StreamClient(server.grpc_url)
    try:
        result = client.send("tensorrt_llm", token_inputs([1, 504], 3), "after").wait(REQUEST_TIMEOUT_S)
    finally:
        client.close()
    assert result.errors == [] and result.finals == 1 and len(result.tokens()) == 3
