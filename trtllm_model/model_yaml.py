"""NVIDIA's LLM API model configuration (`tensorrt_llm/1/model.yaml`), read as NVIDIA's model reads it.

The file lives in the model's version directory, or where `LLM_CONFIG_PATH` says (relative to that directory, or
absolute). `triton_config` sets the Triton side (decoupled, max_batch_size, cancellation_check_period_ms,
multimodal); `logits_post_processors` names processors as `module.path:attribute`; every other key is an argument
of `tensorrt_llm.LLM(...)`. One key is ours: `executor` (default `trtllm_llmapi`). `executor: transformers` serves
the same interface on the embedded engine, with `model` a local Hugging Face checkpoint or `smollm2` (built in).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .params import ConfigError

LLM_CONFIG_ENV = "LLM_CONFIG_PATH"
DEFAULT_FILE = "model.yaml"
BUILT_IN_MODEL = "smollm2"
EXECUTORS = ("trtllm_llmapi", "transformers")
# LLM(...) arguments the embedded engine also honours, by the transformers executor's parameter names.
EMBEDDED_LLM_ARGUMENTS = {"max_batch_size": "max_batch_size", "max_num_tokens": "max_num_tokens"}


@dataclass(frozen=True, slots=True)
class TritonConfig:
    decoupled: bool = False
    max_batch_size: int = 0
    cancellation_check_period_ms: int = 100
    multimodal: bool = False


@dataclass(frozen=True, slots=True)
class LlmApiConfig:
    path: Path
    triton: TritonConfig
    executor: str
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    logits_post_processors: dict[str, str] = field(default_factory=dict)


def model_yaml_path(version_dir: Path | None) -> Path | None:
    """The model.yaml this model reads, or None when there is none (the inflight-batcher layout)."""
    name = os.environ.get(LLM_CONFIG_ENV) or DEFAULT_FILE
    path = Path(name)
    if not path.is_absolute():
        if version_dir is None:
            return None
        path = Path(version_dir) / path
    if path.is_file():
        return path
    if os.environ.get(LLM_CONFIG_ENV):
        raise ConfigError(f"{LLM_CONFIG_ENV}={name}: no such file ({path})")
    return None


def read_model_yaml(path: Path) -> LlmApiConfig:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read it as YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of LLM arguments and a triton_config section")
    data = dict(data)
    triton = _triton_config(path, data.pop("triton_config", None))
    processors = data.pop("logits_post_processors", None) or {}
    if not isinstance(processors, dict) or not all(isinstance(v, str) for v in processors.values()):
        raise ConfigError(f"{path}: logits_post_processors must map names to 'module.path:attribute' strings")
    executor = data.pop("executor", "trtllm_llmapi")
    if executor not in EXECUTORS:
        raise ConfigError(f"{path}: executor={executor!r}: expected one of {', '.join(EXECUTORS)}")
    if "model" not in data:
        raise ConfigError(f"{path}: `model` is required (a Hugging Face checkpoint directory"
                          f"{', or smollm2 with executor: transformers' if executor == 'transformers' else ''})")
    return LlmApiConfig(Path(path), triton, executor, data, {str(k): v for k, v in processors.items()})


def _triton_config(path: Path, section: Any) -> TritonConfig:
    if section is None:
        raise ConfigError(f"{path}: triton_config is required (decoupled, max_batch_size), as in NVIDIA's model.yaml")
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: triton_config must be a mapping")
    known = set(TritonConfig.__dataclass_fields__)
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown triton_config key(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    for key in ("decoupled", "max_batch_size"):
        if key not in section:
            raise ConfigError(f"{path}: triton_config.{key} is required")
    values = {}
    for key, kind in (("decoupled", bool), ("multimodal", bool), ("max_batch_size", int),
                      ("cancellation_check_period_ms", int)):
        if key not in section:
            continue
        value = section[key]
        if kind is bool and not isinstance(value, bool):
            raise ConfigError(f"{path}: triton_config.{key}={value!r}: expected true or false")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{path}: triton_config.{key}={value!r}: expected an integer >= 0")
        values[key] = value
    if values.get("cancellation_check_period_ms") == 0:
        raise ConfigError(f"{path}: triton_config.cancellation_check_period_ms must be at least 1")
    return TritonConfig(**values)


def embedded_parameters(config: LlmApiConfig) -> tuple[dict[str, str], list[str]]:
    """config.pbtxt-style parameters for the transformers executor, and the LLM arguments it does not use."""
    model = str(config.llm_kwargs["model"])
    params = {} if model == BUILT_IN_MODEL else {"model_dir": model}
    ignored = []
    for key, value in config.llm_kwargs.items():
        if key in EMBEDDED_LLM_ARGUMENTS:
            params[EMBEDDED_LLM_ARGUMENTS[key]] = str(value)
        elif key != "model":
            ignored.append(key)
    return params, sorted(ignored)
