"""Build limits: read from engine directories of both config.json layouts and from the LLM API's checkpoint,
combined with config.pbtxt's, and the requests past them refused before they reach the executor."""

from __future__ import annotations

import json

import numpy as np
import pytest
from trtllm_support import forget_tensorrt_llm, make_checkpoint_dir, make_engine_dir, use_fake_tensorrt_llm

from trtllm_model.conventions.common import InvalidInput, Limits
from trtllm_model.conventions.inflight_batcher import parse_request
from trtllm_model.executor_interface import BuildLimits, GenerationRequest
from trtllm_model.executors import create_executor
from trtllm_model.executors.trtllm_engine import engine_build_limits, engine_vocab_size
from trtllm_model.executors.trtllm_llmapi import checkpoint_max_seq_len
from trtllm_model.params import ConfigError, Params
from trtllm_model.pipeline.build_limits import request_limits

LAYOUTS = ("build_config", "builder_config")


@pytest.fixture(autouse=True)
def _forget_the_fake_afterwards():
    yield
    forget_tensorrt_llm()


@pytest.fixture
def fake(monkeypatch):
    use_fake_tensorrt_llm(monkeypatch)


def engine_dir(tmp_path, layout: str):
    return make_engine_dir(tmp_path / layout, vocab_size=1000, max_input_len=1024, max_seq_len=2048,
                           max_beam_width=4, max_batch_size=16, layout=layout)


def requested(input_ids: list[int], max_tokens: int, limits: Limits, **scalars) -> GenerationRequest:
    tensors = {"input_ids": np.array([input_ids], np.int32), "request_output_len": np.array([[max_tokens]], np.int32)}
    tensors |= {name: np.array([[value]], np.int32) for name, value in scalars.items()}
    return parse_request(tensors, {}, limits, None).generation


# -- trtllm_engine: config.json of either layout ---------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_engine_limits_are_read_from_either_layout(tmp_path, layout):
    directory = engine_dir(tmp_path, layout)
    limits = engine_build_limits(directory)
    assert (limits.max_input_len, limits.max_seq_len, limits.max_beam_width, limits.max_batch_size) == (
        1024, 2048, 4, 16)
    assert layout in limits.source and str(directory) in limits.source
    assert engine_vocab_size(directory) == 1000


def test_older_builder_config_with_max_seq_len_reads_it_directly(tmp_path):
    directory = make_engine_dir(tmp_path, max_input_len=100, max_seq_len=300, layout="builder_config")
    config = json.loads((directory / "config.json").read_text())
    config["builder_config"]["max_seq_len"] = 250  # later builders wrote max_seq_len into builder_config too
    (directory / "config.json").write_text(json.dumps(config))
    assert engine_build_limits(directory).max_seq_len == 250


def test_config_json_without_its_build_section_is_a_config_error(tmp_path):
    directory = make_engine_dir(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    del config["build_config"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no 'build_config' section"):
        engine_build_limits(directory)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_engine_executor_reports_what_it_serves(fake, tmp_path, layout):
    directory = engine_dir(tmp_path, layout)
    narrowed, _ = create_executor({"executor": "trtllm_engine", "gpt_model_path": str(directory),
                                   "max_beam_width": "2", "max_batch_size": "8"})
    default, _ = create_executor({"executor": "trtllm_engine", "gpt_model_path": str(directory)})
    try:
        assert (narrowed.build_limits.max_input_len, narrowed.build_limits.max_seq_len) == (1024, 2048)
        assert (narrowed.build_limits.max_beam_width, narrowed.build_limits.max_batch_size) == (2, 8)
        # ExecutorConfig's max_beam_width defaults to 1: that is all the executor serves, whatever the engine has.
        assert (default.build_limits.max_beam_width, default.build_limits.max_batch_size) == (1, 16)
        assert narrowed.vocab_size == 1000
    finally:
        narrowed.shutdown()
        default.shutdown()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("key", "value", "built"), [
    ("max_input_len", "2048", "max_input_len=1024"), ("max_output_len", "4096", "max_seq_len=2048"),
    ("max_beam_width", "8", "max_beam_width=4"), ("max_batch_size", "32", "max_batch_size=16"),
])
def test_config_value_over_the_engine_fails_the_load_naming_both(fake, tmp_path, monkeypatch, layout, key, value,
                                                                 built):
    monkeypatch.setenv("FAKE_TRTLLM_GPU", "0")  # checked before tensorrt_llm is even imported (no engine load)
    with pytest.raises(ConfigError, match=f"{key}={value} is larger than {built}, what the engine in .*{layout}"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(engine_dir(tmp_path, layout)),
                         key: value})


# -- the model's limits: config.pbtxt narrows the build, never widens it ------------------------------------------
def test_request_limits_take_the_build_where_config_is_silent():
    build = BuildLimits(max_input_len=1024, max_seq_len=2048, max_beam_width=4, max_batch_size=16)
    assert request_limits(Params({}), build) == {"max_input_len": 1024, "max_output_len": None,
                                                 "max_seq_len": 2048, "max_beam_width": 4}
    narrowed = Params({"max_input_len": "100", "max_output_len": "50", "max_beam_width": "2", "max_batch_size": "8"})
    assert request_limits(narrowed, build) == {"max_input_len": 100, "max_output_len": 50, "max_seq_len": 2048,
                                               "max_beam_width": 2}
    assert request_limits(Params({"max_input_len": "9999"}), BuildLimits())["max_input_len"] == 9999
    with pytest.raises(ConfigError, match="max_output_len=4096 is larger than max_seq_len=2048, what the engine"):
        request_limits(Params({"max_output_len": "4096"}), build)


def test_requests_past_the_limits_are_refused_naming_the_field_and_both_numbers():
    limits = Limits(**request_limits(Params({}), BuildLimits(max_input_len=8, max_seq_len=20, max_beam_width=2)))
    with pytest.raises(InvalidInput, match=r"input_ids: prompt of 9 tokens is over max_input_len=8"):
        requested(list(range(9)), 1, limits)
    with pytest.raises(InvalidInput, match=r"request_output_len=13: with the prompt's 8 tokens that is 21, over "
                                           r"max_seq_len=20"):
        requested(list(range(8)), 13, limits)
    with pytest.raises(InvalidInput, match=r"beam_width=3: over max_beam_width=2"):
        requested([1], 1, limits, beam_width=3)
    at_the_edge = requested(list(range(8)), 12, limits, beam_width=2)
    assert (len(at_the_edge.input_ids), at_the_edge.max_tokens, at_the_edge.beam_width) == (8, 12, 2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_model_limits_follow_the_engine_of_either_layout(fake, tmp_path, layout):
    executor, params = create_executor({"executor": "trtllm_engine", "max_beam_width": "2",
                                        "gpt_model_path": str(engine_dir(tmp_path, layout))})
    try:
        limits = Limits(**request_limits(params, executor.build_limits))
        for prompt, max_tokens, beams in ((1025, 1, 1), (1000, 1049, 1), (10, 5, 3)):
            with pytest.raises(InvalidInput, match="max_input_len=1024|max_seq_len=2048|max_beam_width=2"):
                requested(list(range(prompt)), max_tokens, limits, beam_width=beams)
    finally:
        executor.shutdown()


# -- trtllm_llmapi: the checkpoint and the LLM's arguments ---------------------------------------------------------
def test_llmapi_limits_come_from_the_checkpoint_and_the_llm_arguments(fake, tmp_path):
    checkpoint = str(make_checkpoint_dir(tmp_path / "m", max_position_embeddings=512))
    executor, params = create_executor({"executor": "trtllm_llmapi", "hf_model_path": checkpoint,
                                        "max_beam_width": "2", "max_batch_size": "8"})
    chunked, _ = create_executor({"executor": "trtllm_llmapi", "hf_model_path": checkpoint,
                                  "enable_chunked_context": "true"})
    try:
        limits = executor.build_limits
        # max_input_len: the LLM's max_num_tokens (8192 by default), which a prompt may not pass without chunking.
        assert (limits.max_input_len, limits.max_seq_len, limits.max_beam_width, limits.max_batch_size) == (
            8192, 512, 2, 8)
        assert "max_position_embeddings" in limits.source
        assert (chunked.build_limits.max_input_len, chunked.build_limits.max_beam_width) == (None, 1)
        with pytest.raises(ConfigError, match="max_output_len=1000 is larger than max_seq_len=512, what the LLM"):
            request_limits(Params({"max_output_len": "1000"}), limits)
        model_limits = Limits(**request_limits(params, limits))
        with pytest.raises(InvalidInput, match="max_seq_len=512"):
            requested(list(range(12)), 501, model_limits)
        with pytest.raises(InvalidInput, match="max_beam_width=2"):
            requested([1], 4, model_limits, beam_width=3)
    finally:
        executor.shutdown()
        chunked.shutdown()


def test_llmapi_config_value_over_the_checkpoint_fails_the_load_naming_both(fake, tmp_path):
    checkpoint = str(make_checkpoint_dir(tmp_path / "m", max_position_embeddings=512))
    with pytest.raises(ConfigError, match="max_output_len=4096 is larger than max_seq_len=512, what the LLM over"):
        create_executor({"executor": "trtllm_llmapi", "hf_model_path": checkpoint, "max_output_len": "4096"})


@pytest.mark.parametrize(("config", "expected"), [
    ({"max_position_embeddings": 4096}, 4096),
    ({}, 2048),  # the PyTorch backend's fallback when the checkpoint does not say
    ({"text_config": {"max_position_embeddings": 1000}}, 1000),
    ({"max_position_embeddings": 1000, "rope_scaling": {"type": "linear", "factor": 2.0}}, 2000),
    ({"max_position_embeddings": 1000, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 1000),
])
def test_checkpoint_sequence_length_as_the_pytorch_backend_infers_it(config, expected):
    assert checkpoint_max_seq_len(config) == expected
