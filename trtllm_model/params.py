"""Typed, validated access to `config.pbtxt` parameters.

Values are strings; an empty value or an unfilled `${...}` placeholder means unset (as in NVIDIA's templates).
Every error names the parameter, so a bad config fails to load with a message a user can act on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

# Parameters of NVIDIA's tensorrt_llm model that are accepted everywhere (a drop-in repository carries them
# even when the chosen executor has no use for them).
NVIDIA_PARAMETERS = frozenset(
    {
        "gpt_model_path", "gpt_model_type", "max_beam_width", "batch_scheduler_policy",
        "kv_cache_free_gpu_mem_fraction", "max_tokens_in_paged_kv_cache", "enable_kv_cache_reuse",
        "enable_chunked_context", "max_attention_window_size", "sink_token_length",
        "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks", "normalize_log_probs",
        "exclude_input_in_output", "gpu_device_ids", "decoding_mode", "cancellation_check_period_ms",
        "stats_check_period_ms", "iter_stats_max_iterations", "request_stats_max_iterations",
        "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction",
        "lora_cache_host_memory_bytes", "lora_prefetch_dir", "max_queue_delay_microseconds",
        "participant_ids", "executor_worker_path", "encoder_model_path", "encoder_input_features_data_type",
        "medusa_choices", "eagle_choices", "gpu_weights_percent", "enable_context_fmha_fp32_acc",
        "multi_block_mode", "cuda_graph_mode", "cuda_graph_cache_size", "tokenizer_dir",
        "FORCE_CPU_ONLY_INPUT_TENSORS", "xgrammar_tokenizer_info_path", "guided_decoding_backend",
        "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size",
        "max_num_sequences", "recv_poll_period_ms", "max_queue_size",
    }
)

# Ours, common to every executor.
COMMON_PARAMETERS = frozenset(
    {"executor", "max_batch_size", "max_input_len", "max_output_len", "sender_threads", "apply_chat_template",
     "max_batched_rows_in_flight", "stop_by_request_id"}
)

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class ConfigError(ValueError):
    """A config.pbtxt parameter is unknown or malformed."""


def parameters_from_model_config(model_config: Mapping | str) -> dict[str, str]:
    """`{"parameters": {"k": {"string_value": "v"}}}` (Triton's model config JSON) -> `{"k": "v"}`."""
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    raw = model_config.get("parameters", {}) or {}
    return {key: str(value.get("string_value", "")) for key, value in raw.items()}


def _is_unset(value: str | None) -> bool:
    return value is None or value.strip() == "" or (value.startswith("${") and value.endswith("}"))


class Params:
    """Parameters of one model config, checked against the names the chosen executor accepts."""

    def __init__(self, raw: Mapping[str, str], accepted: Iterable[str] = ()) -> None:
        self.raw = dict(raw)
        known = NVIDIA_PARAMETERS | COMMON_PARAMETERS | frozenset(accepted)
        unknown = sorted(key for key in self.raw if key not in known)
        if unknown:
            raise ConfigError(
                f"unknown parameter(s) in config.pbtxt: {', '.join(unknown)} "
                f"(accepted here: {', '.join(sorted(known - NVIDIA_PARAMETERS))} and NVIDIA's names)"
            )

    def is_set(self, key: str) -> bool:
        return not _is_unset(self.raw.get(key))

    def str(self, key: str, default: str | None = None, choices: Iterable[str] | None = None) -> str | None:
        value = self.raw.get(key)
        if _is_unset(value):
            return default
        value = value.strip()
        if choices is not None and value not in set(choices):
            raise ConfigError(f"parameter {key}={value!r}: expected one of {', '.join(sorted(choices))}")
        return value

    def int(
        self, key: str, default: int | None = None, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        value = self.str(key)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"parameter {key}={value!r}: expected an integer") from None
        if minimum is not None and number < minimum:
            raise ConfigError(f"parameter {key}={number}: must be at least {minimum}")
        if maximum is not None and number > maximum:
            raise ConfigError(f"parameter {key}={number}: must be at most {maximum}")
        return number

    def float(
        self, key: str, default: float | None = None, minimum: float | None = None, maximum: float | None = None
    ) -> float | None:
        value = self.str(key)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"parameter {key}={value!r}: expected a number") from None
        if number != number or (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            raise ConfigError(f"parameter {key}={value}: must be within [{minimum}, {maximum}]")
        return number

    def bool(self, key: str, default: bool | None = None) -> bool | None:
        value = self.str(key)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ConfigError(f"parameter {key}={value!r}: expected true or false")

    def int_list(self, key: str, default: list[int] | None = None) -> list[int] | None:
        value = self.str(key)
        if value is None:
            return default
        try:
            return [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise ConfigError(f"parameter {key}={value!r}: expected a comma-separated list of integers") from None
