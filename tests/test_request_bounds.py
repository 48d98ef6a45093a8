"""Size bounds on client inputs, checked before the work they would cost (tokenizing, reading a list, per-step word
tests), and the budget of logits shared by the requests in flight."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from trtllm_model.conventions import llmapi
from trtllm_model.conventions.common import InvalidInput, Limits, longest_token_bytes
from trtllm_model.conventions.inflight_batcher import parse_request, words_to_offsets
from trtllm_model.executor_interface import GenerationRequest, QueueFull, RequestRejected, Step
from trtllm_model.executors import create_executor
from trtllm_model.executors.synthetic import SyntheticTokenizer
from trtllm_model.pipeline.request_checks import (
    MAX_WORD_LIST_TOKENS,
    MAX_WORD_TOKENS,
    MAX_WORDS,
    LogitsBudget,
    LogitsBudgetFull,
    check_request,
)
from trtllm_model.triton import text_pipeline

LIMITS = Limits(max_input_len=16, max_output_len=64, vocab_size=1000)


class CountingTokenizer(SyntheticTokenizer):
    """The synthetic byte tokenizer, counting the bytes it was asked to tokenize."""

    def __init__(self) -> None:
        self.encoded_bytes = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded_bytes += len(text.encode())
        return super().encode(text, add_special_tokens)


def request(**extra) -> dict[str, np.ndarray]:
    tensors = {"input_ids": np.array([[1, 2, 3]], np.int32), "request_output_len": np.array([[4]], np.int32)}
    tensors.update(extra)
    return tensors


def parse(tensors, tokenizer=None, limits=LIMITS):
    return parse_request(tensors, {}, limits, tokenizer)


# -- prompts ------------------------------------------------------------------------------------------------------

def test_a_text_longer_than_max_input_len_tokens_can_be_is_refused_without_tokenizing():
    tokenizer = CountingTokenizer()
    per_token = longest_token_bytes(tokenizer)  # no vocabulary listed: one UTF-8 character, 4 bytes
    limit = LIMITS.max_input_len * per_token
    text = {"text_input": np.array([[b"a" * (limit + 1)]], np.object_), "max_tokens": np.array([[4]], np.int32)}
    with pytest.raises(InvalidInput, match=f"text_input: {limit + 1} bytes cannot fit max_input_len=16 tokens: "
                                           f"at most {limit} bytes"):
        parse(text, tokenizer)
    assert tokenizer.encoded_bytes == 0
    text["text_input"] = np.array([[b"a" * limit]], np.object_)  # within the bytes: tokenized, then counted
    with pytest.raises(InvalidInput, match="prompt of 64 tokens is over max_input_len=16"):
        parse(text, tokenizer)
    assert tokenizer.encoded_bytes == limit


def test_the_longest_token_of_smollm2_bounds_its_text():
    from trtllm_model.embedded.model_loading import load_tokenizer

    tokenizer = load_tokenizer(None, None)
    per_token = longest_token_bytes(tokenizer)
    assert per_token == max(len(entry.encode()) for entry in tokenizer.get_vocab())
    # Every token's text is within it: nothing that fits max_input_len tokens is refused for its bytes.
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    assert max(len(text.encode()) for text in texts) <= per_token


def test_input_ids_over_max_input_len_are_refused_from_the_shape_and_input_lengths_cuts_first():
    with pytest.raises(InvalidInput, match="input_ids: prompt of 5000000 tokens is over max_input_len=16"):
        parse(request(input_ids=np.zeros((1, 5_000_000), np.int32)))
    padded = request(input_ids=np.zeros((1, 40), np.int32), input_lengths=np.array([[3]], np.int32))
    assert parse(padded).generation.input_ids == [0, 0, 0]


@pytest.mark.parametrize("count", [-1, 21, 2**31 - 1])
def test_num_top_log_probs_outside_0_to_20_is_refused(count):
    limits = Limits(max_input_len=16, max_output_len=64, vocab_size=1000, executor_name="transformers",
                    optional_inputs=frozenset({"top_log_probs"}))
    with pytest.raises(InvalidInput, match=r"num_top_log_probs=-?\d+: must be at (least 0|most 20)"):
        parse(request(num_top_log_probs=np.array([[count]], np.int32)), limits=limits)
    assert parse(request(num_top_log_probs=np.array([[20]], np.int32)), limits=limits).generation.num_top_log_probs == 20


# -- word lists ---------------------------------------------------------------------------------------------------

def test_a_token_word_list_longer_than_the_bound_is_refused_from_its_shape():
    huge = np.zeros((1, 2, 800_000), np.int32)  # 3.2 MB, as issue 31's
    for name in ("stop_words_list", "bad_words_list"):
        with pytest.raises(InvalidInput, match=f"{name}: 800000 token ids; at most {MAX_WORD_LIST_TOKENS}"):
            parse(request(**{name: huge}))


@pytest.mark.parametrize("name", ["stop_words", "bad_words"])
def test_text_word_lists_are_bounded_before_tokenizing(name):
    tokenizer = CountingTokenizer()
    per_token = longest_token_bytes(tokenizer)
    cases = {
        f"{MAX_WORDS + 1} words; at most {MAX_WORDS}": [b"w"] * (MAX_WORDS + 1),
        f"a word of {MAX_WORD_TOKENS * per_token + 1} bytes": [b"w" * (MAX_WORD_TOKENS * per_token + 1)],
        f"at most {MAX_WORD_LIST_TOKENS * per_token}": [b"w" * (MAX_WORD_TOKENS * per_token)] * (MAX_WORDS // 8),
    }
    for message, words in cases.items():
        with pytest.raises(InvalidInput, match=f"{name}: .*{message}"):
            parse(request(**{name: np.array([words], np.object_)}), tokenizer)
    assert tokenizer.encoded_bytes == 0
    accepted = parse(request(**{name: np.array([[b"ab", b"c"]], np.object_)}), tokenizer)
    assert getattr(accepted.generation, name) == [[97, 98], [99]]


@pytest.mark.parametrize("words, message", [
    ([[1]] * (MAX_WORDS + 1), f"{MAX_WORDS + 1} words; at most {MAX_WORDS} per list"),
    ([[1] * (MAX_WORD_TOKENS + 1)], f"a word of {MAX_WORD_TOKENS + 1} tokens; at most {MAX_WORD_TOKENS}"),
    ([[1] * MAX_WORD_TOKENS] * (MAX_WORD_LIST_TOKENS // MAX_WORD_TOKENS + 1),
     f"{MAX_WORD_LIST_TOKENS + MAX_WORD_TOKENS} tokens in all; at most {MAX_WORD_LIST_TOKENS}"),
])
def test_every_executor_refuses_word_lists_over_the_bounds(words, message):
    for name in ("stop_words", "bad_words"):
        with pytest.raises(RequestRejected, match=f"{name}: {message}"):
            check_request(GenerationRequest(input_ids=[1], max_tokens=1, **{name: words}), 1000, None)
    lists_within = words_to_offsets([[1, 2]] * MAX_WORDS)
    assert len(parse(request(bad_words_list=lists_within)).generation.bad_words) == MAX_WORDS


def test_embedding_bias_of_the_wrong_size_is_refused_before_reading_it():
    with pytest.raises(InvalidInput, match="embedding_bias: 4000000 values; the vocab size is 1000"):
        parse(request(embedding_bias=np.zeros((1, 4_000_000), np.float32)))
    unknown_vocab = Limits(max_input_len=16)
    with pytest.raises(InvalidInput, match="embedding_bias: 4000000 values; at most 1048576 \\(one per token id\\)"):
        parse(request(embedding_bias=np.zeros((1, 4_000_000), np.float32)), limits=unknown_vocab)


def test_embedding_bias_words_are_bounded_before_tokenizing():
    tokenizer = CountingTokenizer()
    words = np.array([[b"w"] * (MAX_WORDS + 1)], np.object_)
    weights = np.ones((1, MAX_WORDS + 1), np.float32)
    with pytest.raises(InvalidInput, match=f"embedding_bias_words: {MAX_WORDS + 1} words"):
        parse(request(embedding_bias_words=words, embedding_bias_weights=weights), tokenizer)
    assert tokenizer.encoded_bytes == 0


def test_strings_read_whole_are_bounded():
    limits = Limits(max_input_len=16, vocab_size=1000, optional_inputs=frozenset({"cache_salt", "guided_decoding"}))
    with pytest.raises(InvalidInput, match="cache_salt: 5000 bytes; at most 4096"):
        parse(request(cache_salt=np.array([[b"s" * 5000]], np.object_)), limits=limits)
    guide = {"guided_decoding_guide_type": np.array([[b"regex"]], np.object_),
             "guided_decoding_guide": np.array([[b"a" * (2**20 + 1)]], np.object_)}
    with pytest.raises(InvalidInput, match=f"guided_decoding_guide: {2**20 + 1} bytes; at most {2**20}"):
        parse(request(**guide), limits=limits)


# -- the pipeline models and the LLM API convention -------------------------------------------------------------

def test_preprocessing_bounds_queries_and_word_lists_before_tokenizing():
    tokenizer = CountingTokenizer()
    with pytest.raises(text_pipeline.BadInput, match="QUERY: 100 bytes cannot fit max_input_len=16"):
        text_pipeline.encode_batch(tokenizer, ["a" * 100], True, 0, Limits(max_input_len=16))
    with pytest.raises(text_pipeline.BadInput, match=f"BAD_WORDS_DICT: {MAX_WORDS + 1} words"):
        text_pipeline.word_lists("BAD_WORDS_DICT", tokenizer, np.array([[b"w"] * (MAX_WORDS + 1)], np.object_), 1)
    assert tokenizer.encoded_bytes == 0


def test_postprocessing_refuses_sequences_longer_than_tensorrt_llm_writes_before_decoding():
    limits = Limits(max_input_len=16, max_output_len=8)
    tokens = np.full((1, 1, 100), 97, np.int32)
    with pytest.raises(text_pipeline.BadInput, match=r"SEQUENCE_LENGTH: 25 tokens; at most 24"):
        text_pipeline.decode_batch(SyntheticTokenizer(), tokens, np.array([[25]], np.int32), True, limits)
    assert text_pipeline.decode_batch(SyntheticTokenizer(), tokens, np.array([[24]], np.int32), True, limits)[0, 0] \
        == b"a" * 24


def llmapi_parse(tokenizer, features=frozenset(), **tensors):
    arrays = {"text_input": np.array([b"hi"], np.object_), "sampling_param_max_tokens": np.array([3], np.int32)}
    arrays.update(tensors)
    options = llmapi.LlmApiOptions(executor_features=frozenset(features))
    return llmapi.parse_request(arrays, Limits(max_input_len=16, executor_name="transformers"), tokenizer, options)


def test_llmapi_prompt_and_stop_strings_are_bounded_before_tokenizing():
    tokenizer = CountingTokenizer()
    with pytest.raises(InvalidInput, match="text_input: 65 bytes cannot fit max_input_len=16"):
        llmapi_parse(tokenizer, text_input=np.array([b"a" * 65], np.object_))
    with pytest.raises(InvalidInput, match=f"sampling_param_stop: {MAX_WORDS + 1} words"):
        llmapi_parse(tokenizer, sampling_param_stop=np.array([b"x"] * (MAX_WORDS + 1), np.object_))
    assert tokenizer.encoded_bytes == 0


def test_lora_path_with_lora_off_says_the_same_whether_the_path_exists(tmp_path):
    """Refused before the file system is touched: a client learns nothing about the server's paths."""
    errors = []
    for path in (str(tmp_path), str(tmp_path / "no-such-adapter")):
        with pytest.raises(InvalidInput) as raised:
            llmapi_parse(SyntheticTokenizer(), lora_id=np.array([1], np.uint64), lora_name=np.array([b"a"], np.object_),
                         lora_path=np.array([path.encode()], np.object_))
        errors.append((raised.value.unsupported, str(raised.value)))
    assert errors[0] == errors[1] == (True, "lora_path: LoRA adapters by path need executor trtllm_llmapi, not "
                                            "transformers")
    with pytest.raises(InvalidInput, match="does not exist"):  # LoRA on: the path is checked
        llmapi_parse(SyntheticTokenizer(), {"lora_request"}, lora_id=np.array([1], np.uint64),
                     lora_name=np.array([b"a"], np.object_),
                     lora_path=np.array([str(tmp_path / "no-such-adapter").encode()], np.object_))


# -- the logits budget --------------------------------------------------------------------------------------------

def test_logits_budget_refuses_past_the_total_and_frees_at_the_final_step():
    budget = LogitsBudget(100)
    with budget.reserve(60) as first:
        first.request_id = 1
    full = "60 held by requests in flight are over max_total_logits_bytes=100"
    with pytest.raises(LogitsBudgetFull, match=full), budget.reserve(50):
        pass
    assert isinstance(LogitsBudgetFull("x"), QueueFull)  # answered UNAVAILABLE, as a full queue
    with pytest.raises(RequestRejected, match="101 bytes of logits at their peak is over max_total_logits_bytes=100"), \
            budget.reserve(101):
        pass
    budget.release([Step(1, [5])])  # not final: still held
    assert budget.held_bytes == 60
    budget.release([Step(1, [6], is_final=True)])
    assert budget.held_bytes == 0
    with pytest.raises(RuntimeError), budget.reserve(90):  # the engine refused it: nothing stays held
        raise RuntimeError("engine refused")
    assert budget.held_bytes == 0


def test_a_request_that_ends_before_its_enqueue_returns_holds_nothing():
    budget = LogitsBudget(100)
    with budget.reserve(60) as reservation:
        budget.release([Step(7, is_final=True)])  # the poller saw its final step first
        reservation.request_id = 7
    assert budget.held_bytes == 0


def test_executors_share_the_budget_between_requests_in_flight():
    executor, _ = create_executor({"executor": "synthetic", "synthetic_step_ms": "50", "synthetic_vocab_size": "1000",
                                   "max_total_logits_bytes": "100000"})
    try:
        def logits_request() -> GenerationRequest:  # 10 tokens x 1000 x 4 bytes = 40000, 80000 at the peak
            return GenerationRequest(input_ids=[1, 2], max_tokens=10, return_generation_logits=True)

        first = executor.enqueue(logits_request())
        with pytest.raises(QueueFull, match="logits budget spent"):
            executor.enqueue(logits_request())
        executor.enqueue(GenerationRequest(input_ids=[1, 2], max_tokens=10))  # no logits: not counted
        ended = threading.Event()
        while not ended.is_set():
            if any(step.is_final and step.request_id == first for step in executor.await_steps(1.0)):
                ended.set()
        executor.enqueue(logits_request())
    finally:
        executor.shutdown()


@pytest.mark.parametrize("ids, bad", [([1, 999, 0], None), ([], None), ([1, 1000], "1000"), ([-1, 2], "-1"),
                                      ([1, True], "True"), ([1, np.int64(3)], "3"), ([1, 2.0], "2.0")])
def test_token_ids_are_plain_ints_in_the_vocabulary_and_a_refusal_names_the_first_that_is_not(ids, bad):
    for name, fields in (("input_ids", {"input_ids": ids or [1]}), ("stop_words", {"input_ids": [1], "stop_words": [ids]})):
        request = GenerationRequest(max_tokens=1, **fields)
        if bad is None:
            check_request(request, 1000, None)
            continue
        with pytest.raises(RequestRejected, match=rf"{name}: token id {re.escape(bad)} is outside the vocabulary"):
            check_request(request, 1000, None)
