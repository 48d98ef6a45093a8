"""Executor over a TensorRT engine directory: `tensorrt_llm.bindings.executor.Executor` (what `trtllm-build` feeds).

Configured with NVIDIA's config.pbtxt names (see trtllm_mapping). Multi-GPU engines run one tritonserver per
MPI rank (leader mode): only the rank where `can_enqueue_requests()` is True serves; the others keep the engine
alive and wait in `shutdown()`. With TRTLLM_ORCHESTRATOR=1 a single tritonserver spawns the MPI workers
(`executor_worker_path`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from ..executor_interface import (
    BuildLimits,
    Executor,
    ExecutorError,
    GenerationRequest,
    IterationStats,
    RequestRejected,
    Step,
    Tokenizer,
)
from ..params import ConfigError, Params
from ..pipeline.build_limits import check_within_build
from ..pipeline.request_checks import check_request
from .trtllm_mapping import (
    NOT_APPLIED_NVIDIA_PARAMETERS,
    executor_config,
    iteration_stats_from,
    step_from_response,
    to_trt_request,
)

PARAMETERS: frozenset[str] = frozenset()  # only NVIDIA's names and the common ones
DEFAULT_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
NO_PACKAGE_FIX = (
    "run in NVIDIA's Triton TensorRT-LLM container (nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3) "
    "or set parameter executor=transformers"
)

log = logging.getLogger(__name__)


def import_tensorrt_llm(module: str, executor: str, fix: str = NO_PACKAGE_FIX) -> ModuleType:
    """Import a tensorrt_llm module, turning "not installed", "a tensorrt_llm without this module" and "no GPU
    driver" into errors that say the fix (`fix`: how this layout chooses another executor)."""
    import importlib
    import sys

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == "tensorrt_llm":
            raise ConfigError(f"executor={executor} needs the tensorrt_llm package, which is not installed where "
                              f"this model's Python looks ({sys.executable}, and PYTHONPATH): {fix}") from exc
        if exc.name and exc.name.startswith("tensorrt_llm."):
            found = sys.modules.get("tensorrt_llm")
            where = getattr(found, "__file__", None) or "(no file)"
            raise ConfigError(f"executor={executor} needs {exc.name}, which the tensorrt_llm package found at {where} "
                              f"does not have (an older TensorRT-LLM, or another package of that name): install a "
                              f"TensorRT-LLM with the LLM API, {fix}") from exc
        raise ExecutorError(f"executor={executor}: importing {module} failed: {exc}") from exc
    except (ImportError, OSError) as exc:
        if "libcuda" in str(exc) or "CUDA" in str(exc):
            raise ExecutorError(
                f"executor={executor}: tensorrt_llm cannot load because no NVIDIA GPU driver is visible ({exc}); "
                "run on a GPU host with the container started with GPU access (docker run --gpus all, or a "
                f"compose device reservation); {fix}"
            ) from exc
        raise ExecutorError(f"executor={executor}: importing {module} failed: {exc}") from exc


def engine_dir_from(params: Params) -> Path:
    """gpt_model_path, checked to be a readable engine directory (config.json + rank*.engine)."""
    value = params.str("gpt_model_path")
    if value is None:
        raise ConfigError("parameter gpt_model_path: required for executor=trtllm_engine; set it to the directory "
                          "trtllm-build wrote (--output_dir), e.g. --set gpt_model_path=/engines/llama")
    path = Path(value)
    if not path.is_dir():
        raise ConfigError(f"parameter gpt_model_path={value}: no such directory; build the engine with "
                          f"trtllm-build --output_dir {value} or mount it there")
    config = path / "config.json"
    if not config.is_file() or not os.access(config, os.R_OK):
        raise ConfigError(f"parameter gpt_model_path={value}: no readable config.json, so not a TensorRT-LLM engine "
                          "directory; point it at trtllm-build's --output_dir (check the mount and file permissions)")
    # rank<r>.engine from trtllm-build; <name>_<precision>_tp<n>[_pp<n>]_rank<r>.engine from the older builder.
    engines = sorted(path.glob("*rank[0-9]*.engine"))
    if not engines or not all(os.access(engine, os.R_OK) for engine in engines):
        raise ConfigError(f"parameter gpt_model_path={value}: no readable rank*.engine file; run trtllm-build "
                          "and check the mount and file permissions")
    return path


def _engine_config(engine_dir: Path) -> tuple[dict, dict, str]:
    """(config.json, its build section, the section's name). As TensorRT-LLM's own parser: a top-level
    "version" (trtllm-build) means "build_config" with the model under "pretrained_config"; none means the
    older builder's "builder_config", which holds the model fields too."""
    path = engine_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"parameter gpt_model_path={engine_dir}: cannot read {path} as JSON ({exc})") from exc
    section = "build_config" if "version" in config else "builder_config"
    build = config.get(section) if isinstance(config, dict) else None
    if not isinstance(build, dict):
        raise ConfigError(f"parameter gpt_model_path={engine_dir}: {path} has no {section!r} section, so it is "
                          "not a TensorRT-LLM engine config; rebuild the engine with trtllm-build")
    return config, build, section


def _positive(section: dict, key: str) -> int | None:
    """A limit from the config; missing or 0 (TensorRT-LLM's "not set") is None."""
    try:
        value = int(section.get(key) or 0)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def engine_build_limits(engine_dir: Path) -> BuildLimits:
    """max_input_len, max_seq_len, max_beam_width and max_batch_size the engine was built with."""
    _, build, section = _engine_config(engine_dir)
    max_input_len = _positive(build, "max_input_len")
    max_seq_len = _positive(build, "max_seq_len")
    output_len = _positive(build, "max_output_len")  # builders before max_seq_len: input + output
    if max_seq_len is None and max_input_len is not None and output_len is not None:
        max_seq_len = max_input_len + output_len
    return BuildLimits(
        max_input_len=max_input_len,
        max_seq_len=max_seq_len,
        max_beam_width=_positive(build, "max_beam_width"),
        max_batch_size=_positive(build, "max_batch_size"),
        source=f"the engine in {engine_dir} ({section} in config.json)",
    )


def engine_vocab_size(engine_dir: Path) -> int | None:
    """vocab_size from the engine's config.json (pretrained_config, or builder_config in older engines)."""
    config, build, section = _engine_config(engine_dir)
    model = config.get("pretrained_config", {}) if section == "build_config" else build
    return _positive(model, "vocab_size")


def orchestrator_worker_path(params: Params) -> str | None:
    """The worker executable in orchestrator mode (TRTLLM_ORCHESTRATOR=1), else None (leader mode)."""
    if os.environ.get("TRTLLM_ORCHESTRATOR") != "1":
        return None
    path = params.str("executor_worker_path", DEFAULT_WORKER_PATH)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ConfigError(f"parameter executor_worker_path={path}: TRTLLM_ORCHESTRATOR=1 needs the "
                          "trtllmExecutorWorker executable; set executor_worker_path to it or unset TRTLLM_ORCHESTRATOR")
    return path


def ignored_parameters(params: Params) -> list[str]:
    """NVIDIA parameters set in config.pbtxt that this executor does not act on (reported, never silent)."""
    return sorted(key for key in NOT_APPLIED_NVIDIA_PARAMETERS if params.is_set(key))


def load_tokenizer(params: Params) -> Tokenizer | None:
    directory = params.str("tokenizer_dir")
    if directory is None:
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError("parameter tokenizer_dir needs the transformers package; install it or unset "
                          "tokenizer_dir (token-level requests only)") from exc
    try:
        return AutoTokenizer.from_pretrained(directory)
    except Exception as exc:
        raise ConfigError(f"parameter tokenizer_dir={directory}: cannot load a tokenizer there ({exc})") from exc


class TrtllmEngineExecutor(Executor):
    # Guided decoding is added where the executor was built with a GuidedDecodingConfig (create()).
    optional_inputs = frozenset({"return_context_logits", "return_generation_logits", "lora"})

    def __init__(self, tle: ModuleType, engine: Any, tokenizer: Tokenizer | None = None) -> None:
        self._tle = tle
        self._engine = engine
        self._tokenizer = tokenizer
        self._is_leader = bool(engine.can_enqueue_requests())
        self._dead: str | None = None
        self._closed = False
        self._shutdown_lock = threading.Lock()
        self._streaming_logits: set[int] = set()  # streaming requests that asked for generation logits

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    def enqueue(self, request: GenerationRequest) -> int:
        if not self._is_leader:
            raise ExecutorError("this MPI rank is a TensorRT-LLM worker; requests go to the leader (rank 0)")
        self._raise_if_unusable()
        check_request(request, self.vocab_size, self.max_logits_bytes)
        try:
            trt_request = to_trt_request(self._tle, request, self._bias_tensor(request))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise RequestRejected(f"TensorRT-LLM rejected the request: {exc}") from exc
        try:
            request_id = self._engine.enqueue_request(trt_request)
            if request.streaming and request.return_generation_logits:
                self._streaming_logits.add(request_id)
            return request_id
        except Exception as exc:
            self._raise_if_unusable()
            if self.health_error():
                raise ExecutorError(self.health_error()) from exc
            raise RequestRejected(f"TensorRT-LLM rejected the request: {exc}") from exc

    def _bias_tensor(self, request: GenerationRequest) -> Any:
        if request.embedding_bias is None:
            return None
        import torch  # tensorrt_llm depends on torch; the binding takes embedding_bias as a tensor

        return torch.tensor(request.embedding_bias, dtype=torch.float32)

    def await_steps(self, timeout_s: float) -> list[Step]:
        if not self._is_leader or self._closed:
            time.sleep(timeout_s)  # workers serve nothing (the engine runs in its own threads); shut down: nothing
            return []
        if self._dead:
            raise ExecutorError(self._dead)
        try:
            # A timedelta: a bare int would select the await_responses(request_id) overload.
            responses = self._engine.await_responses(timeout=timedelta(seconds=max(timeout_s, 0.0)))
        except Exception as exc:
            if self._closed:
                return []
            self._dead = f"TensorRT-LLM executor failed: {exc}"
            raise ExecutorError(self._dead) from exc
        steps = [step_from_response(r, r.request_id in self._streaming_logits) for r in responses]
        for step in steps:
            if step.is_final:
                self._streaming_logits.discard(step.request_id)
        return steps

    def cancel(self, request_id: int) -> None:
        if self._closed or not self._is_leader:
            return
        try:
            self._engine.cancel_request(request_id)
        except RuntimeError as exc:  # the request may already be gone; the engine still answers for live ones
            log.debug("cancel_request(%s) failed: %s", request_id, exc)

    def shutdown(self) -> None:
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
        self._engine.shutdown()  # on a worker rank this returns when the leader shuts down

    def iteration_stats(self) -> list[IterationStats]:
        if self._closed or not self._is_leader:
            return []
        try:
            return [iteration_stats_from(stats) for stats in self._engine.get_latest_iteration_stats()]
        except RuntimeError as exc:
            log.warning("get_latest_iteration_stats failed: %s", exc)
            return []

    def health_error(self) -> str | None:
        if self._dead or self._closed or not self._is_leader:
            return self._dead
        if not self._engine.can_enqueue_requests():  # the engine shut itself down (a fatal error)
            self._dead = "the TensorRT-LLM executor stopped accepting requests (see the engine's log)"
        return self._dead

    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    def _raise_if_unusable(self) -> None:
        if self._dead:
            raise ExecutorError(self._dead)
        if self._closed:
            raise ExecutorError("the TensorRT-LLM executor is shut down")


def create(params: Params) -> TrtllmEngineExecutor:
    if params.is_set("encoder_model_path"):
        raise ConfigError("parameter encoder_model_path: encoder-decoder engines are not supported by "
                          "executor=trtllm_engine; unset it")
    engine_dir = engine_dir_from(params)
    build = engine_build_limits(engine_dir)
    check_within_build(params, build)  # before the (slow) engine load
    worker_path = orchestrator_worker_path(params)
    ignored = ignored_parameters(params)
    if ignored:
        log.warning("executor=trtllm_engine ignores these set parameters: %s", ", ".join(ignored))
    tokenizer = load_tokenizer(params)
    tle = import_tensorrt_llm("tensorrt_llm.bindings.executor", "trtllm_engine")
    config = executor_config(tle, params, worker_path, tokenizer)
    try:
        engine = tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, config)
    except Exception as exc:
        raise ExecutorError(
            f"executor=trtllm_engine: loading the engine in {engine_dir} failed: {exc}. Check that a GPU is "
            "visible (nvidia-smi), that the engine was built by the same TensorRT-LLM version for this GPU, and that "
            "MPI world size matches the engine's tensor/pipeline parallelism (mpirun -n <tp*pp>)"
        ) from exc
    executor = TrtllmEngineExecutor(tle, engine, tokenizer)
    executor.vocab_size = engine_vocab_size(engine_dir)
    # The executor serves at most the beam width it was configured with (ExecutorConfig's default is 1).
    beam_width = min(filter(None, (build.max_beam_width, config.max_beam_width)), default=None)
    executor.build_limits = replace(build, max_beam_width=beam_width,
                                    max_batch_size=config.max_batch_size or build.max_batch_size)
    if config.guided_decoding_config is not None:
        executor.optional_inputs = TrtllmEngineExecutor.optional_inputs | {"guided_decoding"}
    if not executor.is_leader:
        log.info("this rank is a TensorRT-LLM worker in leader mode: it serves no requests")
    return executor
