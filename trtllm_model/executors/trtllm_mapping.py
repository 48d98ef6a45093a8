"""Pure conversions between our executor types and `tensorrt_llm.bindings.executor` objects.

Every function takes the bindings module as `tle`, so the adapter passes the real one and tests pass a fake;
nothing here imports `tensorrt_llm`. Keyword names and types follow the 1.2 nanobind signatures.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

from ..executor_interface import FinishReason, GenerationRequest, IterationStats, KvCacheStats, Step
from ..params import ConfigError, Params

BATCHING_TYPES = {"inflight_fused_batching": "INFLIGHT", "inflight_batching": "INFLIGHT", "v1": "STATIC"}
SCHEDULER_POLICIES = {
    "max_utilization": "MAX_UTILIZATION",
    "guaranteed_no_evict": "GUARANTEED_NO_EVICT",
    "static_batch": "STATIC_BATCH",
}
FINISH_REASONS = {
    "NOT_FINISHED": FinishReason.NOT_FINISHED,
    "END_ID": FinishReason.END_ID,
    "STOP_WORDS": FinishReason.STOP_WORDS,
    "LENGTH": FinishReason.LENGTH,
    "TIMED_OUT": FinishReason.TIMED_OUT,
    "CANCELLED": FinishReason.CANCELLED,
}
# What TensorRT-LLM writes in IterationStats.timestamp.
STATS_TIMESTAMP_FORMAT = "%m-%d-%Y %H:%M:%S.%f"

# NVIDIA parameters that configure parts of TensorRT-LLM these executors do not set up (LoRA, speculative and
# guided decoding, ...): one that is set is named in a warning at load, never silently dropped.
NOT_APPLIED_NVIDIA_PARAMETERS = frozenset(
    {
        "decoding_mode", "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
        "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir", "encoder_model_path",
        "encoder_input_features_data_type", "medusa_choices", "eagle_choices", "enable_context_fmha_fp32_acc",
        "multi_block_mode", "cuda_graph_mode", "cuda_graph_cache_size", "xgrammar_tokenizer_info_path",
        "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size",
        "max_num_sequences",
    }
)


def _set_only(**kwargs: Any) -> dict[str, Any]:
    """Unset parameters are left out, so the binding's own default applies (as NVIDIA's model does)."""
    return {key: value for key, value in kwargs.items() if value is not None}


def batching_type(tle: ModuleType, params: Params) -> Any | None:
    value = params.str("gpt_model_type")
    if value is None:
        return None
    if value.lower() not in BATCHING_TYPES:
        raise ConfigError(f"parameter gpt_model_type={value!r}: expected inflight_fused_batching or v1")
    return getattr(tle.BatchingType, BATCHING_TYPES[value.lower()])


def scheduler_config(tle: ModuleType, params: Params) -> Any:
    policy = params.str("batch_scheduler_policy", choices=SCHEDULER_POLICIES)
    if policy is None:
        return tle.SchedulerConfig()
    return tle.SchedulerConfig(capacity_scheduler_policy=getattr(tle.CapacitySchedulerPolicy, SCHEDULER_POLICIES[policy]))


def kv_cache_config(tle: ModuleType, params: Params) -> Any:
    return tle.KvCacheConfig(
        **_set_only(
            enable_block_reuse=params.bool("enable_kv_cache_reuse"),
            max_tokens=params.int("max_tokens_in_paged_kv_cache", minimum=1),
            max_attention_window=params.int_list("max_attention_window_size"),
            sink_token_length=params.int("sink_token_length", minimum=0),
            free_gpu_memory_fraction=params.float("kv_cache_free_gpu_mem_fraction", minimum=0.0, maximum=1.0),
            host_cache_size=params.int("kv_cache_host_memory_bytes", minimum=0),
            onboard_blocks=params.bool("kv_cache_onboard_blocks"),
        )
    )


def parallel_config(
    tle: ModuleType, params: Params, orchestrator_worker_path: str | None = None
) -> Any | None:
    """Leader mode (MPI, every rank runs tritonserver) unless a worker path is given: then orchestrator mode."""
    device_ids = params.int_list("gpu_device_ids")
    participant_ids = params.int_list("participant_ids")
    if orchestrator_worker_path is None and device_ids is None and participant_ids is None:
        return None
    kwargs = _set_only(device_ids=device_ids, participant_ids=participant_ids)
    if orchestrator_worker_path is not None:
        kwargs["communication_mode"] = tle.CommunicationMode.ORCHESTRATOR
        kwargs["orchestrator_config"] = tle.OrchestratorConfig(
            is_orchestrator=True, worker_executable_path=orchestrator_worker_path
        )
    else:
        kwargs["communication_mode"] = tle.CommunicationMode.LEADER
    return tle.ParallelConfig(communication_type=tle.CommunicationType.MPI, **kwargs)


def guided_decoding_config(tle: ModuleType, params: Params, tokenizer: Any = None) -> Any | None:
    """NVIDIA's `guided_decoding_backend=xgrammar` (+ `tokenizer_dir`) -> GuidedDecodingConfig with the tokenizer's
    vocabulary in id order, its serialised form and its end token, which xgrammar compiles grammars against."""
    backend = params.str("guided_decoding_backend", choices=("xgrammar",))
    if backend is None:
        return None
    if tokenizer is None:
        raise ConfigError("parameter guided_decoding_backend=xgrammar needs tokenizer_dir (the grammar is compiled "
                          "against the tokenizer's vocabulary)")
    vocab = tokenizer.get_vocab()
    return tle.GuidedDecodingConfig(
        tle.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR,
        encoded_vocab=sorted(vocab, key=vocab.__getitem__),
        tokenizer_str=tokenizer.backend_tokenizer.to_str(),
        stop_token_ids=[tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None,
    )


def executor_config(
    tle: ModuleType, params: Params, orchestrator_worker_path: str | None = None, tokenizer: Any = None
) -> Any:
    """NVIDIA's config.pbtxt parameter names -> ExecutorConfig."""
    return tle.ExecutorConfig(
        scheduler_config=scheduler_config(tle, params),
        kv_cache_config=kv_cache_config(tle, params),
        **_set_only(
            max_beam_width=params.int("max_beam_width", minimum=1),
            enable_chunked_context=params.bool("enable_chunked_context"),
            normalize_log_probs=params.bool("normalize_log_probs"),
            iter_stats_max_iterations=params.int("iter_stats_max_iterations", minimum=0),
            request_stats_max_iterations=params.int("request_stats_max_iterations", minimum=0),
            batching_type=batching_type(tle, params),
            max_batch_size=params.int("max_batch_size", minimum=1),
            parallel_config=parallel_config(tle, params, orchestrator_worker_path),
            gpu_weights_percent=params.float("gpu_weights_percent", minimum=0.0, maximum=1.0),
            max_queue_size=params.int("max_queue_size"),
            recv_poll_period_ms=params.int("recv_poll_period_ms", minimum=0),
            guided_decoding_config=guided_decoding_config(tle, params, tokenizer),
        ),
    )


def sampling_config(tle: ModuleType, request: GenerationRequest) -> Any:
    # temperature 0 means greedy here; TensorRT-LLM is greedy when no sampling knob is set.
    temperature = request.temperature if request.temperature else None
    return tle.SamplingConfig(
        request.beam_width,
        **_set_only(
            top_k=request.top_k,
            top_p=request.top_p,
            seed=request.seed,
            temperature=temperature,
            min_tokens=request.min_tokens,
            repetition_penalty=request.repetition_penalty,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            length_penalty=request.length_penalty,
        ),
    )


def lora_config(tle: ModuleType, request: GenerationRequest) -> Any | None:
    """NVIDIA's lora_task_id / lora_weights / lora_config -> tle.LoraConfig (weights and config as torch tensors;
    a task id alone uses the adapter the engine's LoRA cache already holds)."""
    if request.lora_task_id is None:
        return None
    import torch  # tensorrt_llm depends on torch; the binding takes the adapter as tensors

    tensors = {}
    if request.lora_weights is not None:
        tensors["weights"] = torch.from_numpy(request.lora_weights)
        tensors["config"] = torch.from_numpy(request.lora_config.astype("int32"))
    return tle.LoraConfig(request.lora_task_id, **tensors)


def guided_decoding_params(tle: ModuleType, request: GenerationRequest) -> Any | None:
    """NVIDIA's guided_decoding_guide_type / guided_decoding_guide -> tle.GuidedDecodingParams."""
    if request.guided_decoding_type is None:
        return None
    guide_type = tle.GuidedDecodingParams.GuideType[request.guided_decoding_type.upper()]
    return tle.GuidedDecodingParams(guide_type, **_set_only(guide=request.guided_decoding_guide))


def to_trt_request(tle: ModuleType, request: GenerationRequest, embedding_bias: Any = None) -> Any:
    """GenerationRequest -> tle.Request; `embedding_bias` is the request's bias already as a torch tensor."""
    stop_words = [list(word) for word in request.stop_words if word]
    bad_words = [list(word) for word in request.bad_words if word]
    return tle.Request(
        list(request.input_ids),
        request.max_tokens,
        streaming=request.streaming,
        sampling_config=sampling_config(tle, request),
        # Steps carry generated tokens only; the poller prepends the prompt when exclude_input_in_output is false.
        output_config=tle.OutputConfig(
            return_log_probs=request.return_log_probs,
            return_context_logits=request.return_context_logits,
            return_generation_logits=request.return_generation_logits,
            exclude_input_from_output=True,
            return_perf_metrics=request.return_perf_metrics,
        ),
        **_set_only(
            end_id=request.end_id,
            pad_id=request.pad_id,
            stop_words=stop_words or None,
            bad_words=bad_words or None,
            embedding_bias=embedding_bias,
            num_return_sequences=request.num_return_sequences if request.num_return_sequences > 1 else None,
            allotted_time_ms=timedelta(milliseconds=request.allotted_time_ms) if request.allotted_time_ms else None,
            lora_config=lora_config(tle, request),
            guided_decoding_params=guided_decoding_params(tle, request),
        ),
    )


def finish_reason(trt_reason: Any) -> FinishReason:
    return FINISH_REASONS.get(getattr(trt_reason, "name", str(trt_reason)), FinishReason.NOT_FINISHED)


def step_from_response(response: Any, streaming: bool = False) -> Step:
    """One tle.Response -> one Step. With beam_width > 1 the engine sends every beam in full: Step.beams.

    `streaming`: how the request was sent; TensorRT-LLM lays generation logits out [tokens, beams, vocab] when
    streaming, [beams, tokens, vocab] otherwise."""
    if response.has_error():
        return Step(response.request_id, is_final=True, finish_reason=FinishReason.ERROR, error=response.error_msg)
    result = response.result
    reasons = [finish_reason(reason) for reason in result.finish_reasons]
    reason = next((r for r in reasons if r is not FinishReason.NOT_FINISHED), FinishReason.NOT_FINISHED)
    beams = [list(beam) for beam in result.output_token_ids]
    step = Step(
        response.request_id,
        is_final=bool(result.is_final),
        finish_reason=reason,
        sequence_index=int(result.sequence_index),
    )
    if len(beams) > 1:
        step.beams = beams
    elif beams:
        step.token_ids = beams[0]
    if result.log_probs and len(beams) == 1:
        step.log_probs = list(result.log_probs[0])
    elif result.log_probs:
        step.beam_log_probs = [list(beam) for beam in result.log_probs]
        step.beam_cum_log_probs = [float(c) for c in result.cum_log_probs or []]
    if result.cum_log_probs:
        step.cum_log_prob = float(result.cum_log_probs[0])
    if result.context_logits is not None:
        step.context_logits = logits_array(result.context_logits)
    if result.generation_logits is not None:
        logits = logits_array(result.generation_logits)
        step.generation_logits = logits.transpose(1, 0, 2) if streaming else logits
    perf = result.request_perf_metrics
    if perf is not None:
        kv = perf.kv_cache_metrics
        step.kv_cache_alloc_new_blocks = int(kv.num_new_allocated_blocks)
        step.kv_cache_reused_blocks = int(kv.num_reused_blocks)
        step.kv_cache_alloc_total_blocks = int(kv.num_total_allocated_blocks)
    return step


def logits_array(tensor: Any) -> Any:
    """Logits from TensorRT-LLM (a torch tensor on any device, any float type) -> float32 numpy."""
    import numpy as np

    if hasattr(tensor, "detach"):
        tensor = tensor.detach().to("cpu").float().numpy()
    return np.asarray(tensor, dtype=np.float32)


def stats_timestamp(text: str) -> float:
    """IterationStats.timestamp (local time text) -> seconds since the epoch."""
    try:
        return datetime.strptime(text, STATS_TIMESTAMP_FORMAT).timestamp()
    except (TypeError, ValueError):
        return time.time()


def iteration_stats_from(stats: Any) -> IterationStats:
    """tle.IterationStats -> IterationStats (inflight or static batching counters, whichever the engine has)."""
    batching = stats.inflight_batching_stats or stats.static_batching_stats
    kv = stats.kv_cache_stats
    return IterationStats(
        timestamp=stats_timestamp(stats.timestamp),
        iteration=stats.iter,
        active_requests=stats.num_active_requests,
        queued_requests=stats.num_queued_requests,
        max_active_requests=stats.max_num_active_requests,
        scheduled_requests=getattr(batching, "num_scheduled_requests", None),
        context_requests=getattr(batching, "num_context_requests", None),
        generation_requests=getattr(batching, "num_gen_requests", None),
        context_tokens=getattr(batching, "num_ctx_tokens", None),
        paused_requests=getattr(batching, "num_paused_requests", None),
        micro_batch_id=getattr(batching, "micro_batch_id", None),
        cpu_mem_bytes=stats.cpu_mem_usage,
        gpu_mem_bytes=stats.gpu_mem_usage,
        pinned_mem_bytes=stats.pinned_mem_usage,
        kv_cache=None if kv is None else KvCacheStats(
            max_blocks=kv.max_num_blocks,
            free_blocks=kv.free_num_blocks,
            used_blocks=kv.used_num_blocks,
            tokens_per_block=kv.tokens_per_block,
        ),
    )
