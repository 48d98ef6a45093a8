"""conventions/parsing.py: an execute() batch's requests parsed together, their text prompts tokenized in one call, give
each request what parsing it alone gives, and a request that fails fails alone."""

from __future__ import annotations

import numpy as np
import pytest

from trtllm_model.conventions.common import InvalidInput, Limits
from trtllm_model.conventions.inflight_batcher import parse_request, request_parser
from trtllm_model.conventions.parsing import parse_together
from trtllm_model.embedded.model_loading import load_tokenizer
from trtllm_model.pipeline.detokenizer import chat_prompt_text

LIMITS = Limits(max_input_len=64, max_output_len=64)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _text(text: str | bytes, max_tokens: int = 8, **flags) -> dict:
    raw = text if isinstance(text, bytes) else text.encode()
    tensors = {"text_input": np.array([[raw]], np.object_), "max_tokens": np.array([[max_tokens]], np.int32)}
    tensors.update({name: np.array([[value]]) for name, value in flags.items()})
    return tensors


def _batch() -> list[dict]:
    return [
        _text("What is the capital of France?", apply_chat_template=True),
        _text("Plain text, tokenized with the tokenizer's own BOS if it adds one"),
        {"input_ids": np.array([[1, 504, 3575]], np.int32), "request_output_len": np.array([[4]], np.int32)},
        _text(""),  # empty prompt
        _text("héllo wörld 🙂 " * 40),  # over max_input_len in tokens: refused once tokenized
        _text(b"\xff\xfe not UTF-8"),
        _text("Why is the sky blue?", apply_chat_template=True),
        {"stop": np.array([[True]]), "input_ids": np.array([[1]], np.int32), "request_output_len": np.array([[1]], np.int32)},
        _text("Why is the sky blue?", 10_000),  # max_tokens over max_output_len: refused after the prompt
    ]


def _chat(tokenizer):
    return lambda text: chat_prompt_text(tokenizer, [{"role": "user", "content": text}])


def test_a_batch_parses_as_each_request_alone(tokenizer):
    chat = _chat(tokenizer)
    together = parse_together([request_parser(t, {}, LIMITS, tokenizer, chat) for t in _batch()], tokenizer)
    assert len(together) == len(_batch())
    for tensors, outcome in zip(_batch(), together, strict=True):
        try:
            alone = parse_request(tensors, {}, LIMITS, tokenizer, chat)
        except InvalidInput as exc:
            assert isinstance(outcome, InvalidInput) and str(outcome) == str(exc)
        else:
            assert outcome == alone
    failed = [str(o) for o in together if isinstance(o, Exception)]
    assert [message.split(":")[0] for message in failed] == ["text_input", "input_ids", "text_input", "max_tokens=10000"]
    assert together[0].generation.input_ids[-4:] == tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert together[7].stop_only


class _RefusesOne:
    """A tokenizer whose Rust side refuses any text with "bad" in it, in a batch or alone."""

    class backend_tokenizer:  # noqa: N801 - the attribute name transformers gives it
        truncation = padding = None
        encode_special_tokens = False

        @staticmethod
        def encode_batch(texts, add_special_tokens=True):
            if any("bad" in text for text in texts):
                raise ValueError("refused")
            raise AssertionError("not reached in this test")

        @staticmethod
        def encode(text, add_special_tokens=True):
            if "bad" in text:
                raise ValueError(f"refused {text!r}")
            return type("Encoding", (), {"ids": [len(text)]})()

    eos_token_id = 0


def test_a_prompt_the_tokenizer_refuses_fails_alone():
    tokenizer = _RefusesOne()
    outcomes = parse_together([request_parser(_text(t), {}, LIMITS, tokenizer) for t in ("good", "bad", "fine!")],
                              tokenizer)
    assert outcomes[0].generation.input_ids == [4] and outcomes[2].generation.input_ids == [5]
    assert isinstance(outcomes[1], ValueError) and "refused 'bad'" in str(outcomes[1])


@pytest.mark.parametrize("executor_name, says", [("synthetic", "the synthetic executor"), ("", "this executor")])
def test_an_optional_input_the_executor_lacks_is_refused_naming_the_executor(tokenizer, executor_name, says):
    limits = Limits(max_input_len=64, max_output_len=64, executor_name=executor_name)
    request = {**_text("Hi"), "return_context_logits": np.array([[True]])}
    with pytest.raises(InvalidInput, match=f"^return_context_logits: {says} does not support it$") as refused:
        parse_request(request, {}, limits, tokenizer)
    assert refused.value.unsupported
