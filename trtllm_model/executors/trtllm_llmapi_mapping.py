"""Pure conversions between our executor types and the LLM API (`tensorrt_llm.LLM`): no tensorrt_llm import here.

`sampling_kwargs` builds the keyword-only SamplingParams arguments; `steps_from_output` turns one streamed
`RequestOutput` (cumulative `token_ids`, per-step `token_ids_diff`) into the Steps it adds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..executor_interface import (
    FinishReason,
    GenerationRequest,
    IterationStats,
    KvCacheStats,
    RequestRejected,
    Step,
    Tokenizer,
)
from ..params import ConfigError, Params
from .trtllm_mapping import logits_array, stats_timestamp

# The LLM API's finish_reason strings ('stop' is split by stop_reason: None means the end token).
FINISH_REASONS = {"length": FinishReason.LENGTH, "timeout": FinishReason.TIMED_OUT, "cancelled": FinishReason.CANCELLED}
LLMAPI_PARAMETERS = frozenset({"hf_model_path", "llm_backend", "tensor_parallel_size", "pipeline_parallel_size"})
# NVIDIA's engine-executor names that have no LLM API counterpart here (warned about when set).
ENGINE_ONLY_NVIDIA_PARAMETERS = frozenset(
    {
        "gpt_model_path", "gpt_model_type", "batch_scheduler_policy", "max_attention_window_size", "sink_token_length",
        "kv_cache_onboard_blocks", "normalize_log_probs", "gpu_device_ids", "participant_ids", "executor_worker_path",
        "request_stats_max_iterations", "gpu_weights_percent", "recv_poll_period_ms",
    }
)


def _set_only(**kwargs: Any) -> dict[str, Any]:
    return {key: value for key, value in kwargs.items() if value is not None}


def kv_cache_kwargs(params: Params) -> dict[str, Any]:
    """NVIDIA's KV-cache parameter names -> `tensorrt_llm.llmapi.KvCacheConfig` keywords (set ones only)."""
    return _set_only(
        free_gpu_memory_fraction=params.float("kv_cache_free_gpu_mem_fraction", minimum=0.0, maximum=1.0),
        max_tokens=params.int("max_tokens_in_paged_kv_cache", minimum=1),
        enable_block_reuse=params.bool("enable_kv_cache_reuse"),
        host_cache_size=params.int("kv_cache_host_memory_bytes", minimum=0),
    )


def llm_kwargs(params: Params) -> dict[str, Any]:
    """`LLM(...)` keywords from config.pbtxt parameters, without kv_cache_config (the caller builds that object)."""
    model = params.str("hf_model_path")
    if model is None:
        raise ConfigError("parameter hf_model_path: required for executor=trtllm_llmapi; set it to a Hugging Face "
                          "checkpoint directory (config.json + weights), e.g. --set hf_model_path=/models/llama")
    backend = params.str("llm_backend", "pytorch", choices=("pytorch", "_autodeploy"))
    # The PyTorch backend records iteration stats (the metrics' source) only when asked to.
    stats = params.int("iter_stats_max_iterations", minimum=0) != 0
    return dict(
        model=model,
        backend=backend,
        **_set_only(
            enable_iter_perf_stats=True if stats else None,
            tensor_parallel_size=params.int("tensor_parallel_size", minimum=1),
            pipeline_parallel_size=params.int("pipeline_parallel_size", minimum=1),
            max_batch_size=params.int("max_batch_size", minimum=1),
            max_beam_width=params.int("max_beam_width", minimum=1),
            enable_chunked_prefill=params.bool("enable_chunked_context"),
            guided_decoding_backend=params.str("guided_decoding_backend", choices=("xgrammar",)),
        ),
    )


def _split_words(
    words: list[list[int]], tokenizer: Tokenizer | None, field_name: str
) -> tuple[list[int], list[str]]:
    """Single-token words go as ids; the API takes longer words only as strings, so those are decoded."""
    ids, texts = [], []
    for word in words:
        if len(word) == 1:
            ids.append(word[0])
        elif word:
            if tokenizer is None:
                raise RequestRejected(
                    f"{field_name}: a word of several tokens needs the model's tokenizer, which this LLM lacks",
                    unsupported=True,
                )
            texts.append(tokenizer.decode(word, skip_special_tokens=False))
    return ids, texts


def sampling_kwargs(
    request: GenerationRequest, tokenizer: Tokenizer | None, to_tensor: Callable[[list[float]], Any] | None = None
) -> dict[str, Any]:
    """GenerationRequest -> keywords for `SamplingParams(**kwargs)`; RequestRejected for what the API lacks.

    `to_tensor` turns the embedding bias into the torch tensor SamplingParams takes (None: bias unsupported).
    """
    if request.embedding_bias is not None and to_tensor is None:
        raise RequestRejected("embedding_bias: not supported here (no tensor library)", unsupported=True)
    stop_ids, stop_texts = _split_words(request.stop_words, tokenizer, "stop_words")
    bad_ids, bad_texts = _split_words(request.bad_words, tokenizer, "bad_words")
    kwargs = _set_only(
        max_tokens=request.max_tokens,
        end_id=request.end_id,
        pad_id=request.pad_id,
        top_k=request.top_k,
        top_p=request.top_p,
        temperature=request.temperature if request.temperature else None,  # 0 means greedy: leave unset
        seed=request.seed,
        min_tokens=request.min_tokens,
        repetition_penalty=request.repetition_penalty,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        length_penalty=request.length_penalty,
        stop_token_ids=stop_ids or None,
        stop=stop_texts or None,
        bad_token_ids=bad_ids or None,
        bad=bad_texts or None,
        # N: the N likeliest tokens' log probs at each position (the PyTorch backend's dicts), the sampled one's too.
        logprobs=max(request.num_top_log_probs, 1) if request.return_log_probs or request.num_top_log_probs else None,
        return_context_logits=request.return_context_logits or None,
        return_generation_logits=request.return_generation_logits or None,
    )
    if request.embedding_bias is not None:
        kwargs["embedding_bias"] = to_tensor(request.embedding_bias)
    if request.stop_words:
        kwargs["include_stop_str_in_output"] = True  # keep stop words in the output, as the engine executor does
    if request.beam_width > 1:
        kwargs.update(use_beam_search=True, best_of=request.beam_width, n=min(request.num_return_sequences,
                                                                               request.beam_width))
    elif request.num_return_sequences > 1:
        kwargs["n"] = request.num_return_sequences
    return kwargs


# NVIDIA's guided_decoding_guide_type -> the field of the LLM API's GuidedDecodingParams that takes the guide.
GUIDE_FIELDS = {"json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar", "structural_tag": "structural_tag"}


def guided_decoding_kwargs(request: GenerationRequest, params_cls: type | None) -> dict[str, Any]:
    """NVIDIA's guided_decoding_guide_type / guided_decoding_guide -> SamplingParams' `guided_decoding` keyword
    (`tensorrt_llm.llmapi.GuidedDecodingParams`); nothing for an unguided request."""
    if request.guided_decoding_type is None:
        return {}
    if params_cls is None:
        raise RequestRejected("guided_decoding_guide_type: this LLM was built without guided_decoding_backend",
                              unsupported=True)
    if request.guided_decoding_type == "json":
        return {"guided_decoding": params_cls(json_object=True)}
    return {"guided_decoding": params_cls(**{GUIDE_FIELDS[request.guided_decoding_type]: request.guided_decoding_guide})}


@dataclass
class OutputState:
    """What the adapter remembers about one streamed request between RequestOutput updates."""

    beam_search: bool
    want_log_probs: bool
    top_log_probs: int = 0  # the likeliest tokens wanted at each position (num_top_log_probs)
    timed_out: bool = False
    finished_sequences: set[int] = field(default_factory=set)
    final_sent: bool = False


def finish_reason(reason: str | None, stop_reason: Any, timed_out: bool = False) -> FinishReason:
    if reason is None:
        return FinishReason.NOT_FINISHED
    if reason == "stop":
        return FinishReason.END_ID if stop_reason is None else FinishReason.STOP_WORDS
    if reason == "cancelled" and timed_out:
        return FinishReason.TIMED_OUT  # our allotted_time_ms timer aborted it
    return FINISH_REASONS.get(reason, FinishReason.END_ID)  # a reason newer than this code: the sequence did end


def log_probs_of(entries: list[Any], tokens: list[int]) -> list[float]:
    """logprobs_diff holds floats (TensorRT backend) or {token_id: Logprob} dicts (PyTorch backend)."""
    values = []
    for entry, token in zip(entries, tokens):
        if isinstance(entry, dict):
            entry = entry.get(token, next(iter(entry.values()), None))
        values.append(float(getattr(entry, "logprob", entry)))
    return values


def top_log_probs_of(entries: list[Any], k: int) -> list[list[tuple[int, float]]]:
    """The k likeliest (token id, log prob) at each position, likeliest first: from the PyTorch backend's
    {token_id: Logprob(logprob, rank)} dicts, which hold the top k and the sampled token (rank 1 is the likeliest);
    the TensorRT backend's plain floats name no alternatives (an empty list)."""
    tops = []
    for entry in entries:
        if not isinstance(entry, dict):
            tops.append([])
            continue
        ranked = sorted(entry.items(), key=lambda item: (getattr(item[1], "rank", None) or float("inf"),
                                                         -float(getattr(item[1], "logprob", item[1]))))
        tops.append([(int(token), float(getattr(value, "logprob", value))) for token, value in ranked[:k]])
    return tops


def steps_from_output(request_id: int, output: Any, state: OutputState) -> list[Step]:
    """The Steps one RequestOutput update adds; the last one has is_final when the request finished."""
    steps: list[Step] = []
    if state.beam_search:
        first = output.outputs[0]
        step = Step(
            request_id,
            beams=[list(o.token_ids) for o in output.outputs],
            finish_reason=finish_reason(first.finish_reason, first.stop_reason, state.timed_out),
            cum_log_prob=first.cumulative_logprob if state.want_log_probs else None,
        )
        if state.want_log_probs:  # every beam in full, as its tokens
            step.beam_log_probs = [log_probs_of(list(o.logprobs or []), list(o.token_ids)) for o in output.outputs]
            step.beam_cum_log_probs = [float(o.cumulative_logprob or 0.0) for o in output.outputs]
        steps.append(step)
    else:
        for completion in output.outputs:
            if completion.index in state.finished_sequences:
                continue
            reason = finish_reason(completion.finish_reason, completion.stop_reason, state.timed_out)
            tokens = list(completion.token_ids_diff)
            if not tokens and reason is FinishReason.NOT_FINISHED:
                continue
            step = Step(request_id, tokens, finish_reason=reason, sequence_index=completion.index)
            if state.want_log_probs or state.top_log_probs:
                step.log_probs = log_probs_of(list(completion.logprobs_diff or []), tokens)
                step.cum_log_prob = completion.cumulative_logprob
            if state.top_log_probs:
                step.top_log_probs = top_log_probs_of(list(completion.logprobs_diff or []), state.top_log_probs)
            logits = getattr(completion, "generation_logits", None)  # cumulative; set only when asked for
            if logits is not None and tokens:
                step.generation_logits = logits_array(logits)[-len(tokens):][None]  # this step's rows: [beams, tokens, vocab]
            if reason is not FinishReason.NOT_FINISHED:
                state.finished_sequences.add(completion.index)
            steps.append(step)
    context = getattr(output, "context_logits", None)
    if context is not None and steps:
        steps[0].context_logits = logits_array(context)
    if output.finished:
        if not steps:
            last = output.outputs[-1]
            reason = finish_reason(last.finish_reason, last.stop_reason, state.timed_out)
            if reason is FinishReason.NOT_FINISHED:
                reason = FinishReason.TIMED_OUT if state.timed_out else FinishReason.CANCELLED
            steps.append(Step(request_id, finish_reason=reason, sequence_index=last.index))
        steps[-1].is_final = True
        state.final_sent = True
    return steps


def _kv_cache_stats(kv: dict | None) -> KvCacheStats | None:
    if not kv:
        return None
    return KvCacheStats(max_blocks=kv.get("maxNumBlocks", 0), free_blocks=kv.get("freeNumBlocks", 0),
                        used_blocks=kv.get("usedNumBlocks", 0), tokens_per_block=kv.get("tokensPerBlock", 0))


def iteration_stats_from_json(stats: dict | str) -> IterationStats:
    """One entry of `LLM.get_stats()` (IterationStats as JSON: camelCase keys, or the JSON text) -> IterationStats."""
    if isinstance(stats, str):
        stats = json.loads(stats)
    batching = stats.get("inflightBatchingStats") or stats.get("staticBatchingStats") or {}
    timestamp = stats.get("timestamp")
    return IterationStats(
        timestamp=stats_timestamp(timestamp) if isinstance(timestamp, str) else time.time(),
        iteration=stats.get("iter", 0),
        active_requests=stats.get("numActiveRequests", 0),
        queued_requests=stats.get("numQueuedRequests", 0),
        max_active_requests=stats.get("maxNumActiveRequests", 0),
        scheduled_requests=batching.get("numScheduledRequests"),
        context_requests=batching.get("numContextRequests"),
        generation_requests=batching.get("numGenRequests"),
        context_tokens=batching.get("numCtxTokens"),
        paused_requests=batching.get("numPausedRequests"),
        micro_batch_id=batching.get("microBatchId"),
        cpu_mem_bytes=stats.get("cpuMemUsage"),
        gpu_mem_bytes=stats.get("gpuMemUsage"),
        pinned_mem_bytes=stats.get("pinnedMemUsage"),
        kv_cache=_kv_cache_stats(stats.get("kvCacheStats")),
    )
