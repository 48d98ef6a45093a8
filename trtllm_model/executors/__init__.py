"""Executors by name. Each module is imported only when chosen, so `tensorrt_llm` and `torch` load only if needed.

An executor module exposes `PARAMETERS` (the config.pbtxt names it reads, beyond the common and NVIDIA ones)
and `create(params: Params) -> Executor`. Every executor runs request_checks.check_request before enqueue.
"""

from __future__ import annotations

import importlib

from ..executor_interface import DEFAULT_MAX_LOGITS_BYTES, Executor
from ..params import ConfigError, Params
from ..pipeline.request_checks import DEFAULT_TOTAL_LOGITS_REQUESTS, LogitsBudget, bound_logits_in_flight
from ..pipeline.request_checks import PARAMETERS as CHECK_PARAMETERS

DEFAULT_EXECUTOR = "transformers"

EXECUTOR_MODULES = {
    "synthetic": "trtllm_model.executors.synthetic",
    "transformers": "trtllm_model.executors.transformers_executor",
    "trtllm_engine": "trtllm_model.executors.trtllm_engine",
    "trtllm_llmapi": "trtllm_model.executors.trtllm_llmapi",
}


def create_executor(raw_params: dict[str, str], override: str | None = None, shared_as: str | None = None,
                    peers: int = 1) -> tuple[Executor, Params]:
    """Build the executor named by `override` or the `executor` parameter, validating every parameter. The embedded
    engine's worker process is shared by the instances given the same `shared_as` and parameters, up to `peers` of
    them; the other executors ignore both."""
    name = override or Params(raw_params, accepted=raw_params.keys()).str("executor", DEFAULT_EXECUTOR)
    if name not in EXECUTOR_MODULES:
        raise ConfigError(f"parameter executor={name!r}: expected one of {', '.join(sorted(EXECUTOR_MODULES))}")
    module = importlib.import_module(EXECUTOR_MODULES[name])
    params = Params(raw_params, accepted=module.PARAMETERS | CHECK_PARAMETERS)
    bounds = logits_bounds(params)  # before the slow load
    executor = module.create(params, shared_as, peers) if name == "transformers" else module.create(params)
    apply_logits_bounds(executor, bounds)
    return executor, params


def check_parameters(raw_params: dict[str, str], override: str | None = None) -> None:
    """Every parameter checked as create_executor reads it, loading no model (ConfigError names the first bad one);
    what an executor checks only when it loads (TensorRT-LLM's) is left to the load."""
    name = override or Params(raw_params, accepted=raw_params.keys()).str("executor", DEFAULT_EXECUTOR)
    if name not in EXECUTOR_MODULES:
        raise ConfigError(f"parameter executor={name!r}: expected one of {', '.join(sorted(EXECUTOR_MODULES))}")
    module = importlib.import_module(EXECUTOR_MODULES[name])
    params = Params(raw_params, accepted=module.PARAMETERS | CHECK_PARAMETERS)
    logits_bounds(params)
    if hasattr(module, "check_parameters"):
        module.check_parameters(params)


def logits_bounds(params: Params) -> tuple[int, int]:
    """`max_logits_bytes` (one request) and `max_total_logits_bytes` (all requests in flight; default 4 requests'
    worth), checked."""
    one = params.int("max_logits_bytes", DEFAULT_MAX_LOGITS_BYTES, minimum=0)
    return one, params.int("max_total_logits_bytes", DEFAULT_TOTAL_LOGITS_REQUESTS * one, minimum=0)


def apply_logits_bounds(executor: Executor, bounds: tuple[int, int]) -> None:
    executor.max_logits_bytes = bounds[0]
    bound_logits_in_flight(executor, LogitsBudget(bounds[1]))
