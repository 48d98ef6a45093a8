"""Request tensors -> GenerationRequest, and outputs back: the checks every request goes through."""

from __future__ import annotations

import numpy as np
import pytest

from trtllm_model.conventions.common import InvalidInput, Limits, ResponseContent
from trtllm_model.conventions.inflight_batcher import (
    parameters_dict,
    parse_request,
    response_outputs,
    split_batch,
    words_from_offsets,
    words_to_offsets,
)
from trtllm_model.executors.synthetic import SyntheticTokenizer

LIMITS = Limits(max_input_len=16, max_output_len=64, vocab_size=1000)


def tokens(ids, max_tokens=8, **extra):
    tensors = {"input_ids": np.array([ids], np.int32), "request_output_len": np.array([[max_tokens]], np.int32)}
    tensors.update(extra)
    return tensors


def parse(tensors, limits=LIMITS, tokenizer=None, parameters=None):
    return parse_request(tensors, parameters or {}, limits, tokenizer)


def test_token_request_maps_nvidia_names():
    parsed = parse(tokens(
        [1, 2, 3], 5,
        streaming=np.array([[True]]), runtime_top_k=np.array([[4]], np.int32),
        runtime_top_p=np.array([[0.5]], np.float32), temperature=np.array([[0.7]], np.float32),
        random_seed=np.array([[9]], np.uint64), min_length=np.array([[2]], np.int32),
        end_id=np.array([[7]], np.int32), return_log_probs=np.array([[True]]),
    ))
    g = parsed.generation
    assert (g.input_ids, g.max_tokens, g.streaming, g.top_k, g.seed, g.min_tokens, g.end_id) == ([1, 2, 3], 5, True, 4, 9, 2, 7)
    assert g.top_p == pytest.approx(0.5) and g.temperature == pytest.approx(0.7)
    assert parsed.return_log_probs and not parsed.text_mode


@pytest.mark.parametrize(
    "top_k, top_p, expected",
    [
        (None, None, (1, None)),  # TensorRT-LLM's defaults (top_k 0, top_p 0): greedy
        (1, 0.0, (1, None)),  # NVIDIA's client's defaults: greedy
        (0, 0.0, (1, None)),
        (0, -1.0, (1, None)),  # NVIDIA's model drops top_p <= 0
        (0, 0.9, (None, pytest.approx(0.9))),  # top-p sampling
        (40, 0.0, (40, None)),  # top-k sampling
        (40, 0.5, (40, pytest.approx(0.5))),
    ],
)
def test_top_k_top_p_read_as_nvidia_does(top_k, top_p, expected):
    extra = {}
    if top_k is not None:
        extra["runtime_top_k"] = np.array([[top_k]], np.int32)
    if top_p is not None:
        extra["runtime_top_p"] = np.array([[top_p]], np.float32)
    g = parse(tokens([1], **extra)).generation
    assert (g.top_k, g.top_p) == expected


def test_zero_beam_width_and_sequences_mean_one_as_nvidia_reads_them():
    g = parse(tokens([1], beam_width=np.array([[0]], np.int32), num_return_sequences=np.array([[0]], np.int32))).generation
    assert (g.beam_width, g.num_return_sequences) == (1, 1)
    assert parse(tokens([1], end_id=np.array([[-1]], np.int32))).generation.end_id == -1  # no end token


def test_input_lengths_truncates_the_padded_prompt():
    assert parse(tokens([1, 2, 0, 0], input_lengths=np.array([[2]], np.int32))).generation.input_ids == [1, 2]
    # Longer than the ids given: all of them (NVIDIA's model slices), not an error.
    assert parse(tokens([1, 2], input_lengths=np.array([[9]], np.int32))).generation.input_ids == [1, 2]


@pytest.mark.parametrize(
    "tensors, field",
    [
        ({"request_output_len": np.array([[4]], np.int32)}, "input_ids or text_input"),
        (tokens([1], 0), "request_output_len"),
        (tokens([1], 65), "request_output_len"),
        (tokens([]), "input_ids"),
        (tokens(list(range(17))), "max_input_len"),
        (tokens([1, 5000]), "input_ids: token id 5000"),
        (tokens([1, -3]), "input_ids: token id -3"),
        (tokens([1], temperature=np.array([[-1.0]], np.float32)), "temperature"),
        (tokens([1], temperature=np.array([[np.nan]], np.float32)), "temperature"),
        (tokens([1], runtime_top_p=np.array([[1.5]], np.float32)), "runtime_top_p"),
        (tokens([1], runtime_top_k=np.array([[-1]], np.int32)), "runtime_top_k"),
        (tokens([1], repetition_penalty=np.array([[0.0]], np.float32)), "repetition_penalty"),
        (tokens([1], beam_width=np.array([[-1]], np.int32)), "beam_width"),
        (tokens([1], num_return_sequences=np.array([[-1]], np.int32)), "num_return_sequences"),
        (tokens([1], stop_words_list=np.array([[[1, 2], [3, -1]]], np.int32)), "stop_words_list"),
        (tokens([1], bad_words_list=np.array([[1, 2, 3]], np.int32)), "bad_words_list"),
        (tokens([1], top_k=np.array([[1]], np.int32), runtime_top_k=np.array([[1]], np.int32)), "give only one"),
        (tokens([1], streaming=np.array([[1]], np.int32)), "streaming"),
        (tokens([1], request_output_len=np.array([[1, 2]], np.int32)), "request_output_len"),
        ({**tokens([1]), "text_input": np.array([[b"hi"]], np.object_)}, "text_input and input_ids"),
    ],
)
def test_bad_input_names_the_field(tensors, field):
    with pytest.raises(InvalidInput, match=field.replace("(", r"\(")) as error:
        parse(tensors)
    assert not error.value.unsupported


def test_text_request_needs_a_tokenizer_and_valid_utf8():
    text = {"text_input": np.array([[b"hello"]], np.object_), "max_tokens": np.array([[4]], np.int32)}
    with pytest.raises(InvalidInput, match="no tokenizer") as error:
        parse(text)
    assert error.value.unsupported
    bad = dict(text, text_input=np.array([[b"\xff\xfe"]], np.object_))
    with pytest.raises(InvalidInput, match="text_input: not valid UTF-8"):
        parse(bad, tokenizer=SyntheticTokenizer())
    empty = dict(text, text_input=np.array([[b""]], np.object_))
    with pytest.raises(InvalidInput, match="text_input: the prompt is empty"):
        parse(empty, tokenizer=SyntheticTokenizer())


def test_text_request_encodes_prompt_and_words_and_defaults_end_id():
    tensors = {
        "text_input": np.array([[b"hi"]], np.object_),
        "max_tokens": np.array([[4]], np.int32),
        "stop_words": np.array([[b"ab", b""]], np.object_),
    }
    parsed = parse(tensors, tokenizer=SyntheticTokenizer())
    assert parsed.text_mode and parsed.generation.input_ids == [104, 105]
    assert parsed.generation.stop_words == [[97, 98]]
    assert parsed.generation.end_id == SyntheticTokenizer.eos_token_id


def test_word_lists_round_trip():
    words = [[5], [6, 7, 8], [9, 10]]
    assert words_from_offsets("stop_words_list", words_to_offsets(words)) == words


def test_unknown_request_parameters_are_refused_but_triton_ones_pass():
    assert parameters_dict('{"triton_enable_empty_final_response": true}', frozenset()) == {
        "triton_enable_empty_final_response": True
    }
    with pytest.raises(InvalidInput, match="unknown request parameter.*tempreature"):
        parameters_dict('{"tempreature": 1}', frozenset())


def test_stop_request_only_cancels():
    assert parse({"stop": np.array([[True]])}).stop_only


def test_response_outputs_shapes():
    parsed = parse(tokens([1, 2], return_log_probs=np.array([[True]])))
    out = response_outputs(parsed, ResponseContent([[5, 6]], log_probs=[[-0.1, -0.2]], cum_log_probs=[-0.3]))
    assert out["output_ids"].shape == (1, 1, 2) and out["output_ids"].dtype == np.int32
    assert out["sequence_length"].tolist() == [[2]]
    assert out["output_log_probs"].shape == (1, 1, 2) and out["cum_log_probs"].shape == (1, 1)
    beams = response_outputs(parsed, ResponseContent([[1, 2, 3], [4]], log_probs=[[-1.0, -1.0, -1.0], [-2.0]],
                                                     cum_log_probs=[-3.0, -2.0]))
    assert beams["output_ids"].tolist() == [[[1, 2, 3], [4, -1, -1]]]
    assert beams["sequence_length"].tolist() == [[3, 1]]
    assert beams["output_log_probs"].shape == (1, 2, 3) and beams["cum_log_probs"].tolist() == [[-3.0, -2.0]]


def test_a_batched_request_splits_into_one_per_sequence():
    tensors = {"input_ids": np.array([[1, 2, 0], [3, 4, 5]], np.int32), "input_lengths": np.array([[2], [3]], np.int32),
               "request_output_len": np.array([[4], [6]], np.int32)}
    parts = [parse(part).generation for part in split_batch(tensors)]
    assert [(g.input_ids, g.max_tokens) for g in parts] == [([1, 2], 4), ([3, 4, 5], 6)]
    with pytest.raises(InvalidInput, match="request_output_len: batch size 1, but input_ids has a batch of 2"):
        split_batch({**tensors, "request_output_len": np.array([[4]], np.int32)})


def test_text_output_is_one_string_per_beam():
    parsed = parse({"text_input": np.array([[b"hi"]], np.object_), "max_tokens": np.array([[2]], np.int32)},
                   tokenizer=SyntheticTokenizer())
    assert response_outputs(parsed, ResponseContent([[5]], texts=["ab"]))["text_output"].tolist() == [b"ab"]
    two = response_outputs(parsed, ResponseContent([[5], [6]], texts=["ab", "cd"]))["text_output"]
    assert two.shape == (2,)
