"""The streamed text deltas concatenate to exactly the tokenizer's decode of all tokens (SmolLM2's tokenizer)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtllm_model.conventions.common import Limits
from trtllm_model.conventions.inflight_batcher import parse_request
from trtllm_model.embedded.model_loading import load_tokenizer
from trtllm_model.openai_frontend.tokenization import chat_prompt_ids as openai_chat_prompt_ids
from trtllm_model.pipeline.detokenizer import (
    MAX_WINDOW_TOKENS,
    IncrementalDetokenizer,
    chat_prompt_ids,
    chat_prompt_text,
)

PROMPTS = [
    "Héllo wörld, naïve café crème brûlée — Ångström",
    "你好，世界！今天天气很好。日本語のテキストも。한국어 문장",
    "Emoji: 🎉🚀👩‍👩‍👧 🇫🇷 ❤️ 🤖🧠",
    "Ελληνικά, русский текст, עברית, العربية",
    "mixed:\tTabs\nnew lines  double  spaces ... and 'quotes' \"here\"",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


# One token-length table shared by every stream of a test run, as model.py shares one between a model's requests.
SHARED_LENGTHS: dict[int, int] = {}


def streamed(tokenizer, ids: list[int], chunks: list[int], token_lengths: dict[int, int] | None = None) -> list[str]:
    """Push `ids` in chunks of the given sizes (cycled), then flush; returns the deltas."""
    detokenizer = IncrementalDetokenizer(tokenizer, token_lengths=token_lengths)
    deltas, start, index = [], 0, 0
    while start < len(ids):
        size = chunks[index % len(chunks)] if chunks else 1
        deltas.append(detokenizer.push(ids[start : start + size]))
        start += size
        index += 1
    deltas.append(detokenizer.flush())
    return deltas


def full_decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def _byte_token_ids(tokenizer) -> list[int]:
    """Ids of tokens that decode to part of a multi-byte UTF-8 character on their own."""
    return [i for i in range(len(tokenizer)) if tokenizer.decode([i]) == "\ufffd"]


@pytest.mark.parametrize("text", PROMPTS)
def test_unicode_text_streams_without_split_characters(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = streamed(tokenizer, ids, [1])
    assert "".join(deltas) == full_decode(tokenizer, ids)
    # Every character is whole in its delta: no replacement characters appear in the stream.
    assert not any("\ufffd" in delta for delta in deltas)


@given(st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_token_sequences_concatenate_to_full_decode(tokenizer, data):
    vocab = len(tokenizer)
    token = st.one_of(
        st.integers(0, vocab - 1),  # anything, special tokens included
        st.integers(0, 300),  # specials and single bytes: invalid and partial UTF-8
        st.sampled_from(tokenizer.encode(" ".join(PROMPTS), add_special_tokens=False)),
    )
    ids = data.draw(st.lists(token, max_size=80), label="ids")
    chunks = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=8), label="chunks")
    assert "".join(streamed(tokenizer, ids, chunks)) == full_decode(tokenizer, ids)
    # The same deltas with the token lengths kept across streams (what earlier examples left in the table)
    assert streamed(tokenizer, ids, chunks, SHARED_LENGTHS) == streamed(tokenizer, ids, chunks)


def test_long_runs_of_partial_characters_stay_exact(tokenizer):
    partial = _byte_token_ids(tokenizer)
    assert len(partial) > 100
    word = tokenizer.encode(" ok", add_special_tokens=False)
    emoji = tokenizer.encode("🎉", add_special_tokens=False)
    ids = [partial[(7 * i) % len(partial)] for i in range(3 * MAX_WINDOW_TOKENS)] + emoji + word + emoji
    assert "".join(streamed(tokenizer, ids, [1])) == full_decode(tokenizer, ids)
    assert "".join(streamed(tokenizer, ids, [3, 1, 2])) == full_decode(tokenizer, ids)


class RecordingDecodes:
    """The tokenizer, keeping the ids of every decode call."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.decoded: list[list[int]] = []

    def decode(self, ids, **kwargs):
        self.decoded.append(list(ids))
        return self.tokenizer.decode(ids, **kwargs)


def test_push_decodes_a_bounded_window(tokenizer):
    """Cost per token does not grow with the stream: decode never sees more than a few tokens."""
    recording = RecordingDecodes(tokenizer)
    ids = tokenizer.encode(" ".join(PROMPTS) * 20, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(recording)
    text = "".join(detokenizer.push([token]) for token in ids) + detokenizer.flush()
    assert text == full_decode(tokenizer, ids)
    assert len(ids) > 1000 and max(len(window) for window in recording.decoded) <= 8


def test_a_one_token_stream_decodes_once(tokenizer):
    """The first token of every stream is on the time to first token: one decode, and nothing more at the end."""
    recording = RecordingDecodes(tokenizer)
    (token,) = tokenizer.encode(" Paris", add_special_tokens=False)[:1]
    detokenizer = IncrementalDetokenizer(recording)
    assert detokenizer.push([token]) + detokenizer.flush() == full_decode(tokenizer, [token])
    assert recording.decoded == [[token]]


def test_a_push_decodes_once_with_its_tokens_lengths_known(tokenizer):
    """A push that sends everything restarts the window at its last token: that token's text length comes from the
    shared table (filled by earlier streams), not from a second decode."""
    ids = tokenizer.encode(" The capital of France is Paris, a city of art.", add_special_tokens=False)
    lengths: dict[int, int] = {}
    first = streamed(tokenizer, ids, [1], lengths)  # fills the table
    recording = RecordingDecodes(tokenizer)
    detokenizer = IncrementalDetokenizer(recording, token_lengths=lengths)
    deltas = [detokenizer.push([token]) for token in ids] + [detokenizer.flush()]
    assert deltas == first and "".join(deltas) == full_decode(tokenizer, ids)
    assert len(recording.decoded) == len(ids)  # one decode a push


def test_chat_template_wraps_one_user_message(tokenizer):
    prompt = tokenizer.decode(chat_prompt_ids(tokenizer, [{"role": "user", "content": "What is the capital of France?"}]))
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.startswith("<|im_start|>system\n")


@pytest.fixture(scope="module")
def bos_adding_tokenizer(tokenizer):
    """SmolLM2's tokenizer made to add a BOS when it encodes, as Llama's and many others do."""
    from transformers import AutoTokenizer

    adding = AutoTokenizer.from_pretrained(tokenizer.name_or_path, add_bos_token=True)
    assert adding.encode("Hi")[0] == adding.bos_token_id
    return adding


@pytest.mark.parametrize("adds_bos", [False, True])
def test_one_conversation_gives_the_same_ids_on_both_chat_paths(tokenizer, bos_adding_tokenizer, adds_bos):
    """The `apply_chat_template` input of the Triton models and the OpenAI frontend's chat: identical ids, with the
    template's one BOS (none doubled by the tokenizer's own)."""
    chat = bos_adding_tokenizer if adds_bos else tokenizer
    question = "What is the capital of France?"
    tensors = {"text_input": np.array([[question.encode()]], np.object_),
               "request_output_len": np.array([[4]], np.int32), "apply_chat_template": np.array([[True]])}
    # The model's apply_chat_template: model.py hands parse_request this function of the text.
    triton_ids = parse_request(tensors, {}, Limits(), chat,
                               lambda text: chat_prompt_text(chat, [{"role": "user", "content": text}])).generation.input_ids
    openai_ids = openai_chat_prompt_ids(chat, [{"role": "user", "content": question}])
    assert triton_ids == openai_ids
    assert openai_ids[0] == chat.bos_token_id and openai_ids[1] != chat.bos_token_id
