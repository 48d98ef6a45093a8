"""Executor over TensorRT-LLM's LLM API (`tensorrt_llm.LLM`, PyTorch backend) and a Hugging Face checkpoint.

The LLM API is asyncio-native: an event loop runs on its own thread; `enqueue` hands each request to it
(`generate_async(..., streaming=True)` must run on that loop for `async for` to work), one task per request
turns each streamed RequestOutput into Steps, and `cancel` calls `abort()` on the loop.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..executor_interface import (
    BuildLimits,
    Executor,
    ExecutorError,
    FinishReason,
    GenerationRequest,
    IterationStats,
    RequestRejected,
    Step,
    Tokenizer,
)
from ..params import ConfigError, Params
from ..pipeline.build_limits import check_within_build
from ..pipeline.request_checks import PARAMETERS as CHECK_PARAMETERS
from ..pipeline.request_checks import check_request
from . import apply_logits_bounds, logits_bounds
from .trtllm_engine import import_tensorrt_llm
from .trtllm_llmapi_mapping import (
    ENGINE_ONLY_NVIDIA_PARAMETERS,
    LLMAPI_PARAMETERS,
    OutputState,
    guided_decoding_kwargs,
    iteration_stats_from_json,
    kv_cache_kwargs,
    llm_kwargs,
    sampling_kwargs,
    steps_from_output,
)
from .trtllm_mapping import NOT_APPLIED_NVIDIA_PARAMETERS

# In NVIDIA's LLM API layout the executor is model.yaml's `executor:` key (config.pbtxt's parameters do not choose it).
MODEL_YAML_FIX = ("run in NVIDIA's Triton TensorRT-LLM container (nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3), "
                  "or set `executor: transformers` in model.yaml (the embedded engine; `trtllm-triton serve "
                  "--executor transformers` overrides it)")

PARAMETERS = LLMAPI_PARAMETERS
ENQUEUE_TIMEOUT_S = 60.0
STATS_TIMEOUT_S = 0.01

log = logging.getLogger(__name__)


@dataclass
class _Live:
    output: Any  # the RequestOutput being streamed
    state: OutputState
    task: asyncio.Task | None = None
    timer: asyncio.TimerHandle | None = None


class LlmApiExecutor(Executor):
    # LoRA here takes adapters by path (LoRARequest), not NVIDIA's weight tensors: UNSUPPORTED. Guided decoding is
    # added where the LLM was built with a guided_decoding_backend (create()).
    optional_inputs = frozenset({"return_context_logits", "return_generation_logits", "top_log_probs"})
    guided_decoding_params_cls: type | None = None  # tensorrt_llm.llmapi.GuidedDecodingParams, when enabled
    # NVIDIA's LLM API inputs this executor honours (conventions/llmapi.py).
    llmapi_features = frozenset({"lora_request", "logits_post_processor"})

    def __init__(self, llm: Any, sampling_params_cls: type, lora_request_cls: type | None = None,
                 logits_post_processors: dict[str, Any] | None = None) -> None:
        self._llm = llm
        self._sampling_params_cls = sampling_params_cls
        self._lora_request_cls = lora_request_cls
        if lora_request_cls is None:  # then lora_path is refused at the edge, before the path is looked at
            self.llmapi_features = self.llmapi_features - {"lora_request"}
        self._processors = logits_post_processors or {}
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._ready: list[Step] = []
        self._live: dict[int, _Live] = {}  # touched only on the loop thread
        self._closed = False
        self._enqueued_any = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtllm-llmapi-loop", daemon=True)
        self._thread.start()

    # -- interface (any thread) ------------------------------------------------------------------------------
    def enqueue(self, request: GenerationRequest) -> int:
        self._raise_if_unusable()
        check_request(request, self.vocab_size, self.max_logits_bytes)
        kwargs = sampling_kwargs(request, self.tokenizer(), float_tensor)
        kwargs.update(guided_decoding_kwargs(request, self.guided_decoding_params_cls))
        if "stop" not in kwargs and "bad" not in kwargs:
            # Only token ids are read here (the poller detokenizes), so the LLM API's own decode of every step, in
            # this process, is work for nothing; word strings keep it (the API may match them on its text).
            kwargs["detokenize"] = False
        if request.logits_post_processor is not None:
            if request.logits_post_processor not in self._processors:
                raise RequestRejected(f"sampling_param_logits_post_processor_name={request.logits_post_processor!r}: "
                                      "not declared under logits_post_processors in model.yaml")
            kwargs["logits_processor"] = self._processors[request.logits_post_processor]
        try:
            params = self._sampling_params_cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise RequestRejected(f"TensorRT-LLM rejected the sampling parameters: {exc}") from exc
        lora = None
        if request.lora_adapter is not None:
            lora_id, name, path, source = request.lora_adapter
            if self._lora_request_cls is None:
                raise RequestRejected("lora_path: this LLM takes no LoRA adapters", unsupported=True)
            try:
                lora = self._lora_request_cls(lora_name=name, lora_int_id=lora_id, lora_path=path,
                                              lora_ckpt_source=source)
            except (TypeError, ValueError) as exc:
                raise RequestRejected(f"lora_path={path!r}: TensorRT-LLM rejected the adapter: {exc}") from exc
        request_id = next(self._ids)
        started = asyncio.run_coroutine_threadsafe(self._start(request_id, request, params, lora), self._loop)
        try:
            started.result(timeout=ENQUEUE_TIMEOUT_S)
        except (TypeError, ValueError) as exc:
            raise RequestRejected(f"TensorRT-LLM rejected the request: {exc}") from exc
        except Exception as exc:
            raise ExecutorError(f"TensorRT-LLM generate_async failed: {exc}") from exc
        self._enqueued_any = True
        return request_id

    def await_steps(self, timeout_s: float) -> list[Step]:
        with self._cond:
            if not self._ready:
                self._cond.wait(timeout_s)
            steps, self._ready = self._ready, []
        error = self.health_error()
        if not steps and error:
            raise ExecutorError(error)
        return steps  # after shutdown: nothing more, without an error (the poller is stopping)

    def cancel(self, request_id: int) -> None:
        if not self._closed:
            self._loop.call_soon_threadsafe(self._abort, request_id, False)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._abort_all(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._llm.shutdown()
        with self._cond:
            self._cond.notify_all()

    def iteration_stats(self) -> list[IterationStats]:
        if self._closed or not self._enqueued_any:
            return []  # the LLM API has no stats before the first request (and says so loudly)
        try:
            return [iteration_stats_from_json(stats) for stats in self._llm.get_stats(timeout=STATS_TIMEOUT_S)]
        except Exception as exc:  # noqa: BLE001 - stats are best effort; serving goes on
            log.warning("LLM.get_stats failed: %s", exc)
            return []

    def health_error(self) -> str | None:
        if not self._closed and not self._thread.is_alive():
            return "the LLM API event loop thread died"
        return None

    def tokenizer(self) -> Tokenizer | None:
        wrapper = getattr(self._llm, "tokenizer", None)
        # The LLM API wraps the Hugging Face tokenizer (TransformersTokenizer.tokenizer); hand out the original,
        # which has everything the text interface uses (apply_chat_template included).
        inner = getattr(wrapper, "tokenizer", None)
        return inner if hasattr(inner, "encode") and hasattr(inner, "decode") else wrapper

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise ExecutorError("the TensorRT-LLM LLM API executor is shut down")
        error = self.health_error()
        if error:
            raise ExecutorError(error)

    # -- loop thread -----------------------------------------------------------------------------------------
    async def _start(self, request_id: int, request: GenerationRequest, params: Any, lora: Any = None) -> None:
        output = self._llm.generate_async({"prompt_token_ids": list(request.input_ids)}, sampling_params=params,
                                          lora_request=lora, streaming=True)
        live = _Live(output, OutputState(beam_search=request.beam_width > 1, want_log_probs=request.return_log_probs,
                                         top_log_probs=request.num_top_log_probs))
        if request.allotted_time_ms:
            live.timer = self._loop.call_later(request.allotted_time_ms / 1000, self._abort, request_id, True)
        live.task = self._loop.create_task(self._stream(request_id, live))
        self._live[request_id] = live

    async def _stream(self, request_id: int, live: _Live) -> None:
        try:
            async for output in live.output:
                self._publish(steps_from_output(request_id, output, live.state))
            if not live.state.final_sent:
                self._publish([Step(request_id, is_final=True, finish_reason=FinishReason.ERROR,
                                    error="the LLM API stream ended without a final response")])
        except Exception as exc:  # noqa: BLE001 - a failed request ends its own stream, never the executor
            self._publish([Step(request_id, is_final=True, finish_reason=FinishReason.ERROR,
                                error=f"TensorRT-LLM: {exc or type(exc).__name__}")])
        finally:
            self._live.pop(request_id, None)
            if live.timer is not None:
                live.timer.cancel()

    def _abort(self, request_id: int, timed_out: bool) -> None:
        live = self._live.get(request_id)
        if live is None or live.state.final_sent:
            return
        live.state.timed_out = live.state.timed_out or timed_out
        live.output.abort()

    async def _abort_all(self) -> None:
        """Abort every live request and give their streams a moment to end before the loop stops."""
        tasks = [live.task for live in self._live.values() if live.task is not None]
        for request_id in list(self._live):
            self._abort(request_id, False)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()

    def _publish(self, steps: list[Step]) -> None:
        if steps:
            with self._cond:
                self._ready.extend(steps)
                self._cond.notify_all()


def float_tensor(values: list[float]) -> Any:
    import torch  # tensorrt_llm depends on torch; SamplingParams.embedding_bias is a tensor

    return torch.tensor(values, dtype=torch.float32)


def ignored_parameters(params: Params) -> list[str]:
    not_applied = NOT_APPLIED_NVIDIA_PARAMETERS | ENGINE_ONLY_NVIDIA_PARAMETERS
    return sorted(key for key in not_applied if params.is_set(key))


def create(params: Params) -> LlmApiExecutor:
    kwargs = llm_kwargs(params)
    checkpoint = Path(kwargs["model"])
    if not (checkpoint / "config.json").is_file():
        raise ConfigError(f"parameter hf_model_path={checkpoint}: no config.json there, so not a Hugging Face "
                          "checkpoint; download the model (hf download <repo> --local-dir DIR) and mount "
                          "DIR, or check the path and file permissions")
    ignored = ignored_parameters(params)
    if ignored:
        log.warning("executor=trtllm_llmapi ignores these set parameters: %s", ", ".join(ignored))
    config = checkpoint_config(checkpoint)
    tensorrt_llm = import_tensorrt_llm("tensorrt_llm", "trtllm_llmapi")
    kv_kwargs = kv_cache_kwargs(params)
    if kv_kwargs:
        llmapi = import_tensorrt_llm("tensorrt_llm.llmapi", "trtllm_llmapi")
        kwargs["kv_cache_config"] = llmapi.KvCacheConfig(**kv_kwargs)
    try:
        llm = tensorrt_llm.LLM(**kwargs)
    except Exception as exc:
        raise ExecutorError(
            f"executor=trtllm_llmapi: loading {checkpoint} failed: {exc}. Check that a GPU is visible (nvidia-smi), "
            "that the checkpoint is complete and of an architecture TensorRT-LLM supports, and that "
            "tensor_parallel_size does not exceed the GPUs available"
        ) from exc
    limits = llm_build_limits(llm.args, config, checkpoint)
    try:
        check_within_build(params, limits)  # the LLM resolves its defaults (max_num_tokens, ...) only when built
    except ConfigError:
        llm.shutdown()
        raise
    executor = LlmApiExecutor(llm, tensorrt_llm.SamplingParams)
    executor.vocab_size = checkpoint_vocab_size(config)
    executor.build_limits = limits
    _enable_guided_decoding(executor, llm)
    return executor


def _lora_enabled(llm: Any) -> bool:
    """Whether the LLM was built to take LoRA adapters (`lora_config`; the TensorRT backend's `enable_lora`)."""
    return getattr(llm.args, "lora_config", None) is not None or bool(getattr(llm.args, "enable_lora", False))


def _enable_guided_decoding(executor: LlmApiExecutor, llm: Any) -> None:
    """NVIDIA's guide inputs are taken only when the LLM was built with a guided-decoding backend."""
    if getattr(llm.args, "guided_decoding_backend", None):
        llmapi = import_tensorrt_llm("tensorrt_llm.llmapi", "trtllm_llmapi")
        executor.guided_decoding_params_cls = llmapi.GuidedDecodingParams
        executor.optional_inputs = LlmApiExecutor.optional_inputs | {"guided_decoding"}


def create_from_model_yaml(config: Any, raw_params: dict[str, str]) -> tuple[LlmApiExecutor, Params]:
    """The executor for NVIDIA's LLM API layout (model_yaml.LlmApiConfig): every LLM argument of model.yaml goes
    to `tensorrt_llm.LLM(**kwargs)` (a `kv_cache_config` mapping as a KvCacheConfig), and the named logits
    post-processors are imported as NVIDIA's model imports them."""
    params = Params(raw_params, accepted=CHECK_PARAMETERS)
    logits = logits_bounds(params)
    kwargs = dict(config.llm_kwargs)
    processors = load_logits_post_processors(config.logits_post_processors)
    tensorrt_llm = import_tensorrt_llm("tensorrt_llm", "trtllm_llmapi", MODEL_YAML_FIX)
    llmapi = import_tensorrt_llm("tensorrt_llm.llmapi", "trtllm_llmapi", MODEL_YAML_FIX)
    if isinstance(kwargs.get("kv_cache_config"), dict):
        kwargs["kv_cache_config"] = llmapi.KvCacheConfig(**kwargs["kv_cache_config"])
    try:
        llm = tensorrt_llm.LLM(**kwargs)
    except Exception as exc:
        raise ExecutorError(f"{config.path}: tensorrt_llm.LLM(**model.yaml) failed: {exc}") from exc
    checkpoint = Path(str(kwargs["model"]))
    checkpoint_json = checkpoint_config(checkpoint) if (checkpoint / "config.json").is_file() else {}
    lora_request_cls = getattr(llmapi, "LoRARequest", None) if _lora_enabled(llm) else None
    executor = LlmApiExecutor(llm, tensorrt_llm.SamplingParams, lora_request_cls, processors)
    executor.vocab_size = checkpoint_vocab_size(checkpoint_json)
    # A hub name (NVIDIA's default model.yaml) has no local config.json: only the LLM's own arguments bound it.
    executor.build_limits = (llm_build_limits(llm.args, checkpoint_json, checkpoint) if checkpoint_json else
                             BuildLimits(max_seq_len=getattr(llm.args, "max_seq_len", None), source=str(config.path)))
    _enable_guided_decoding(executor, llm)
    apply_logits_bounds(executor, logits)
    return executor, params


def load_logits_post_processors(specs: dict[str, str]) -> dict[str, Any]:
    """model.yaml's `logits_post_processors` (name -> 'module.path:attribute') -> name -> processor; a class is
    instantiated once without arguments. Errors name the processor, at load."""
    processors = {}
    for name, spec in specs.items():
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            raise ConfigError(f"logits_post_processors[{name!r}]={spec!r}: expected 'module.path:attribute'")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
            if isinstance(target, type):
                target = target()
        except Exception as exc:
            raise ConfigError(f"logits_post_processors[{name!r}]={spec!r}: cannot load it ({exc})") from exc
        if not callable(target):
            raise ConfigError(f"logits_post_processors[{name!r}]={spec!r}: not callable")
        processors[name] = target
    return processors


def checkpoint_config(checkpoint: Path) -> dict:
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"parameter hf_model_path={checkpoint}: cannot read config.json ({exc})") from exc
    return config if isinstance(config, dict) else {}


def checkpoint_vocab_size(config: dict) -> int | None:
    try:
        return int(config["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None


def checkpoint_max_seq_len(config: dict) -> int:
    """The sequence length the PyTorch backend infers from a checkpoint (as its model engine does): the
    max_position_embeddings (2048 if absent), times the rope scaling factor for linear-style rope types."""
    length = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    length = int(length or 2048)
    rope = config.get("rope_scaling") or {}
    if rope.get("type", rope.get("rope_type")) not in ("su", "longrope", "llama3", "yarn"):
        length = math.ceil(length * float(rope.get("factor", 1.0)))
    return length


def llm_build_limits(args: Any, config: dict, checkpoint: Path) -> BuildLimits:
    """What the LLM serves, from its resolved arguments (`LLM.args`) and the checkpoint.

    max_seq_len: `max_seq_len` when given, never above what the checkpoint supports. A prompt over
    `max_num_tokens` is refused unless chunked prefill is on (LLM.generate_async's check on the PyTorch backend).
    """
    inferred = checkpoint_max_seq_len(config)
    asked = getattr(args, "max_seq_len", None)
    chunked = bool(getattr(args, "enable_chunked_prefill", False))
    return BuildLimits(
        max_input_len=None if chunked else getattr(args, "max_num_tokens", None),
        max_seq_len=min(asked, inferred) if asked else inferred,
        max_beam_width=getattr(args, "max_beam_width", None) or 1,
        max_batch_size=getattr(args, "max_batch_size", None),
        source=f"the LLM over {checkpoint} (max_position_embeddings, LLM arguments)",
    )
