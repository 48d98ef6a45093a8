"""encode_text and encode_texts: the same ids as the tokenizer's own `encode`, taken from the Rust tokenizer only where
that holds."""

from __future__ import annotations

import copy

import pytest

from trtllm_model.embedded.model_loading import load_tokenizer
from trtllm_model.pipeline.detokenizer import chat_prompt_ids
from trtllm_model.pipeline.text_encoding import encode_text, encode_texts

TEXTS = [
    "What is the capital of France?",
    " a leading space",
    "a trailing space ",
    "   ",
    "lines\nand\ttabs\r\n",
    "<|im_start|>user\nspecial tokens written as text<|im_end|>\n",
    "héllo wörld, 世界, emoji 🙂, combining e\u0301",
    "numbers 1234567890 and punctuation !?,.;:()[]{}",
    "long " * 600,
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_the_same_ids_as_the_tokenizers_encode(tokenizer, add_special_tokens):
    for text in TEXTS:
        assert encode_text(tokenizer, text, add_special_tokens) == tokenizer.encode(
            text, add_special_tokens=add_special_tokens), text


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_a_batch_has_the_same_ids_as_the_tokenizers_encode_of_each(tokenizer, add_special_tokens):
    expected = [tokenizer.encode(text, add_special_tokens=add_special_tokens) for text in TEXTS]
    assert encode_texts(tokenizer, TEXTS, add_special_tokens) == expected
    assert encode_texts(tokenizer, TEXTS[:1], add_special_tokens) == expected[:1]
    assert encode_texts(tokenizer, [], add_special_tokens) == []


def test_a_chat_prompt_has_the_same_ids_as_the_template_then_encode(tokenizer):
    for text in TEXTS:
        messages = [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert chat_prompt_ids(tokenizer, messages) == tokenizer.encode(rendered, add_special_tokens=False)


def test_a_tokenizer_set_to_truncate_or_split_special_tokens_is_asked_itself(tokenizer):
    truncating = copy.deepcopy(tokenizer)
    truncating.backend_tokenizer.enable_truncation(max_length=3)
    text = TEXTS[0]
    assert len(encode_text(truncating, text)) > 3
    assert encode_text(truncating, text) == truncating.encode(text)
    assert encode_texts(truncating, [text, text]) == [truncating.encode(text)] * 2

    splitting = copy.deepcopy(tokenizer)
    splitting.split_special_tokens = True
    special = TEXTS[5]
    assert encode_text(splitting, special, False) == splitting.encode(special, add_special_tokens=False)
    assert encode_text(splitting, special, False) != encode_text(tokenizer, special, False)


def test_a_tokenizer_without_a_rust_backend_is_asked_itself():
    class Words:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [len(word) for word in text.split()] + ([0] if add_special_tokens else [])

    assert encode_text(Words(), "one three") == [3, 5, 0]
    assert encode_text(Words(), "one three", add_special_tokens=False) == [3, 5]
    assert encode_texts(Words(), ["one three", "four"]) == [[3, 5, 0], [4, 0]]
