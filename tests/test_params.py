"""config.pbtxt parameters: NVIDIA's placeholders mean unset; unknown or malformed values name the parameter."""

from __future__ import annotations

import pytest

from trtllm_model.executors import create_executor
from trtllm_model.params import ConfigError, Params, parameters_from_model_config


def test_unfilled_placeholders_and_empty_values_are_unset():
    params = Params({"max_beam_width": "${max_beam_width}", "gpt_model_path": "", "max_batch_size": "8"})
    assert params.int("max_beam_width", 1) == 1
    assert params.str("gpt_model_path", "default") == "default"
    assert params.int("max_batch_size") == 8


@pytest.mark.parametrize(
    "raw, read, message",
    [
        ({"max_batch_size": "eight"}, lambda p: p.int("max_batch_size"), "max_batch_size='eight': expected an integer"),
        ({"max_batch_size": "0"}, lambda p: p.int("max_batch_size", minimum=1), "max_batch_size=0: must be at least 1"),
        ({"enable_kv_cache_reuse": "maybe"}, lambda p: p.bool("enable_kv_cache_reuse"), "enable_kv_cache_reuse"),
        ({"kv_cache_free_gpu_mem_fraction": "1.5"},
         lambda p: p.float("kv_cache_free_gpu_mem_fraction", minimum=0.0, maximum=1.0), "kv_cache_free_gpu_mem_fraction"),
        ({"gpu_device_ids": "0,x"}, lambda p: p.int_list("gpu_device_ids"), "gpu_device_ids"),
    ],
)
def test_malformed_values_name_the_parameter(raw, read, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        read(Params(raw))


def test_unknown_parameters_are_refused_but_nvidias_names_pass():
    Params({"batch_scheduler_policy": "max_utilization", "lora_cache_max_adapter_size": "${x}"})
    with pytest.raises(ConfigError, match="unknown parameter.*max_batch_sise"):
        Params({"max_batch_sise": "8"})


def test_an_unknown_executor_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="executor='magic'.*synthetic"):
        create_executor({"executor": "magic"})


def test_parameters_come_from_tritons_model_config_json():
    config = {"parameters": {"executor": {"string_value": "synthetic"}, "max_batch_size": {"string_value": "4"}}}
    assert parameters_from_model_config(config) == {"executor": "synthetic", "max_batch_size": "4"}


def test_the_total_logits_budget_is_a_model_parameter_four_requests_by_default():
    executor, _ = create_executor({"executor": "synthetic", "max_logits_bytes": "1000"})
    try:
        assert executor.logits_budget.limit == 4000
    finally:
        executor.shutdown()
    with pytest.raises(ConfigError, match="max_total_logits_bytes=-1: must be at least 0"):
        create_executor({"executor": "synthetic", "max_total_logits_bytes": "-1"})


@pytest.mark.parametrize("value, message", [("0", "decode_steps=0: must be at least 1"),
                                            ("17", "decode_steps=17: must be at most 16")])
def test_decode_steps_beyond_a_kv_block_are_refused_before_the_model_loads(value, message):
    # Greedy steps launched at once keep padding rows inside the trash block: at most one block's 16 positions.
    with pytest.raises(ConfigError, match=message):
        create_executor({"executor": "transformers", "decode_steps": value})
