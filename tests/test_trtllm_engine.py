"""trtllm_engine: NVIDIA's parameters -> ExecutorConfig, requests/responses/stats mapping, and the executor."""

from __future__ import annotations

import importlib
import os
import time
from datetime import timedelta

import pytest
from trtllm_support import collect_until_final, fake_tokens, forget_tensorrt_llm, make_engine_dir, use_fake_tensorrt_llm

from trtllm_model.executor_interface import ExecutorError, FinishReason, GenerationRequest, RequestRejected
from trtllm_model.executors import create_executor
from trtllm_model.executors.trtllm_mapping import (
    executor_config,
    iteration_stats_from,
    step_from_response,
    to_trt_request,
)
from trtllm_model.params import ConfigError, Params


@pytest.fixture(autouse=True)
def _forget_the_fake_afterwards():
    """Later tests (any module) must not find the fake tensorrt_llm in sys.modules."""
    yield
    forget_tensorrt_llm()

@pytest.fixture
def tle(monkeypatch):
    use_fake_tensorrt_llm(monkeypatch)
    return importlib.import_module("tensorrt_llm.bindings.executor")


@pytest.fixture
def executor(tle, tmp_path):
    created, _ = create_executor(
        {"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(tmp_path / "engine", vocab_size=1000)),
         "max_beam_width": "2", "iter_stats_max_iterations": "100"}
    )
    yield created
    created.shutdown()


# -- configuration ----------------------------------------------------------------------------------------------
def test_nvidia_parameters_map_onto_executor_config(tle):
    params = Params({
        "gpt_model_type": "v1", "max_beam_width": "4", "batch_scheduler_policy": "max_utilization",
        "kv_cache_free_gpu_mem_fraction": "0.5", "max_tokens_in_paged_kv_cache": "4096",
        "enable_kv_cache_reuse": "false", "enable_chunked_context": "true", "max_attention_window_size": "1024,2048",
        "sink_token_length": "4", "kv_cache_host_memory_bytes": "1000000", "kv_cache_onboard_blocks": "false",
        "normalize_log_probs": "false", "gpu_device_ids": "0,1", "iter_stats_max_iterations": "50",
        "request_stats_max_iterations": "7", "max_queue_size": "32", "max_batch_size": "16",
    })
    config = executor_config(tle, params)
    assert config.batching_type == tle.BatchingType.STATIC
    assert config.max_beam_width == 4 and config.max_batch_size == 16 and config.max_queue_size == 32
    assert config.scheduler_config.capacity_scheduler_policy == tle.CapacitySchedulerPolicy.MAX_UTILIZATION
    kv = config.kv_cache_config
    assert (kv.free_gpu_memory_fraction, kv.max_tokens, kv.enable_block_reuse) == (0.5, 4096, False)
    assert (kv.max_attention_window, kv.sink_token_length, kv.host_cache_size, kv.onboard_blocks) == (
        [1024, 2048], 4, 1000000, False)
    assert config.enable_chunked_context is True and config.normalize_log_probs is False
    assert (config.iter_stats_max_iterations, config.request_stats_max_iterations) == (50, 7)
    assert config.parallel_config.device_ids == [0, 1]
    assert config.parallel_config.communication_mode == tle.CommunicationMode.LEADER


def test_unset_and_placeholder_parameters_keep_the_binding_defaults(tle):
    config = executor_config(tle, Params({"gpt_model_type": "${gpt_model_type}", "enable_kv_cache_reuse": ""}))
    default = tle.ExecutorConfig()
    assert config.batching_type == tle.BatchingType.INFLIGHT
    assert config.kv_cache_config.enable_block_reuse is tle.KvCacheConfig().enable_block_reuse
    assert config.max_beam_width == default.max_beam_width and config.parallel_config is None


@pytest.mark.parametrize(("key", "value"), [("gpt_model_type", "dynamic"), ("batch_scheduler_policy", "fifo"),
                                            ("kv_cache_free_gpu_mem_fraction", "1.5"), ("max_beam_width", "two")])
def test_bad_values_are_config_errors_naming_the_parameter(tle, key, value):
    with pytest.raises(ConfigError, match=key):
        executor_config(tle, Params({key: value}))


def test_orchestrator_mode_needs_an_existing_worker(tle, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_ORCHESTRATOR", "1")
    engine_dir = make_engine_dir(tmp_path / "engine")
    with pytest.raises(ConfigError, match="executor_worker_path"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(engine_dir),
                         "executor_worker_path": str(tmp_path / "missing")})
    worker = tmp_path / "trtllmExecutorWorker"
    worker.write_text("#!/bin/sh\n")
    worker.chmod(0o755)
    created, _ = create_executor({"executor": "trtllm_engine", "gpt_model_path": str(engine_dir),
                                  "executor_worker_path": str(worker)})
    try:
        parallel = created._engine.config.parallel_config
        assert parallel.communication_mode == tle.CommunicationMode.ORCHESTRATOR
        assert parallel.orchestrator_config.worker_executable_path == str(worker)
    finally:
        created.shutdown()


def test_engine_dir_errors_name_the_cause_and_the_fix(tle, tmp_path):
    with pytest.raises(ConfigError, match="gpt_model_path: required.*trtllm-build"):
        create_executor({"executor": "trtllm_engine"})
    with pytest.raises(ConfigError, match="no such directory"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(tmp_path / "nope")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no readable config.json"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(tmp_path / "empty")})
    (make_engine_dir(tmp_path / "e") / "rank0.engine").unlink()
    with pytest.raises(ConfigError, match="rank\\*.engine"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(tmp_path / "e")})


def test_unreadable_engine_is_a_config_error(tle, tmp_path, monkeypatch):
    engine_dir = make_engine_dir(tmp_path / "e")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path).endswith(".engine") else
                        real_access(path, mode))  # root reads anything; pretend it can't
    with pytest.raises(ConfigError, match="permissions"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(engine_dir)})


def test_missing_package_says_which_container_or_executor_to_use(tmp_path, monkeypatch):
    forget_tensorrt_llm()  # the fakes are not on the path here: tensorrt_llm is simply not installed
    with pytest.raises(ConfigError, match="not installed.*trtllm-python-py3.*executor=transformers"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(tmp_path / "e"))})


def test_no_gpu_is_an_executor_error_saying_so(monkeypatch, tmp_path):
    use_fake_tensorrt_llm(monkeypatch)
    monkeypatch.setenv("FAKE_TRTLLM_GPU", "0")
    with pytest.raises(ExecutorError, match="no NVIDIA GPU driver.*--gpus all"):
        create_executor({"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(tmp_path / "e"))})


# -- request mapping --------------------------------------------------------------------------------------------
def test_generation_request_maps_onto_request_keywords(tle):
    request = GenerationRequest(
        [1, 2, 3], 20, streaming=True, end_id=2, pad_id=0, exclude_input_in_output=True, temperature=0.7, top_k=5,
        top_p=0.9, seed=42, repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.3, length_penalty=1.5,
        min_tokens=3, stop_words=[[7, 8], [9]], bad_words=[[4]], return_log_probs=True, beam_width=2,
        num_return_sequences=2, allotted_time_ms=1500,
    )
    trt = to_trt_request(tle, request)
    assert (trt.input_token_ids, trt.max_tokens, trt.streaming, trt.end_id, trt.pad_id) == ([1, 2, 3], 20, True, 2, 0)
    assert trt.stop_words == [[7, 8], [9]] and trt.bad_words == [[4]]
    assert trt.num_return_sequences == 2 and trt.allotted_time_ms == timedelta(milliseconds=1500)
    assert trt.output_config.return_log_probs is True and trt.output_config.exclude_input_from_output is True
    s = trt.sampling_config
    assert (s.beam_width, s.top_k, s.top_p, s.seed, s.temperature, s.min_tokens) == (2, 5, 0.9, 42, 0.7, 3)
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.length_penalty) == (1.1, 0.2, 0.3, 1.5)


def test_the_prompt_is_never_in_the_engine_output(executor):
    """A non-streaming request with exclude_input_in_output=False: the poller adds the prompt, not the engine."""
    request_id = executor.enqueue(GenerationRequest([7, 8], 3, streaming=False, exclude_input_in_output=False))
    steps = collect_until_final(executor, {request_id})
    assert [t for s in steps for t in s.token_ids] == [9, 10, 11] and len(steps) == 1


def test_defaults_leave_the_engine_defaults(tle):
    trt = to_trt_request(tle, GenerationRequest([5], 4, temperature=0.0))
    assert trt.stop_words is None and trt.bad_words is None and trt.allotted_time_ms is None
    assert trt.sampling_config.temperature is None  # 0 means greedy, which is the engine's default
    assert trt.num_return_sequences == 1 and trt.end_id is None


# -- response and stats mapping ---------------------------------------------------------------------------------
def _result(tle, tokens, reasons, is_final=False, log_probs=None, cum=None, sequence_index=0):
    result = tle.Result()
    result.output_token_ids, result.finish_reasons, result.is_final = tokens, reasons, is_final
    result.log_probs, result.cum_log_probs, result.sequence_index = log_probs or [], cum or [], sequence_index
    return result


@pytest.mark.parametrize("name", ["END_ID", "STOP_WORDS", "LENGTH", "TIMED_OUT", "CANCELLED", "NOT_FINISHED"])
def test_every_finish_reason_maps(tle, name):
    step = step_from_response(tle.Response(3, _result(tle, [[1]], [tle.FinishReason[name]], is_final=True)))
    assert step.finish_reason is FinishReason[name]


def test_response_maps_tokens_log_probs_and_sequence_index(tle):
    response = tle.Response(9, _result(tle, [[5, 6]], [tle.FinishReason.NOT_FINISHED], log_probs=[[-0.1, -0.2]],
                                       cum=[-0.3], sequence_index=1))
    step = step_from_response(response)
    assert (step.request_id, step.token_ids, step.is_final, step.sequence_index) == (9, [5, 6], False, 1)
    assert step.log_probs == [-0.1, -0.2] and step.cum_log_prob == -0.3 and step.beams is None


def test_beams_go_to_step_beams(tle):
    tokens = [[1, 2], [1, 3]]
    step = step_from_response(tle.Response(4, _result(tle, tokens, [tle.FinishReason.LENGTH] * 2, is_final=True)))
    assert step.beams == tokens and step.token_ids == [] and step.finish_reason is FinishReason.LENGTH


def test_error_response_is_a_final_error_step(tle):
    step = step_from_response(tle.Response(4, error_msg="boom"))
    assert (step.is_final, step.finish_reason, step.error) == (True, FinishReason.ERROR, "boom")


def test_iteration_stats_map(tle):
    stats = tle.IterationStats()
    stats.timestamp, stats.iter = "12-02-2026 12:00:01.500000", 17
    stats.num_active_requests, stats.num_queued_requests, stats.max_num_active_requests = 3, 2, 64
    stats.gpu_mem_usage, stats.cpu_mem_usage, stats.pinned_mem_usage = 10, 20, 30
    stats.kv_cache_stats = tle.KvCacheStats(100, 60, 40, 32)
    stats.inflight_batching_stats = tle.InflightBatchingStats(3, 1, 2, 128)
    mapped = iteration_stats_from(stats)
    assert (mapped.iteration, mapped.active_requests, mapped.queued_requests, mapped.max_active_requests) == (
        17, 3, 2, 64)
    assert (mapped.scheduled_requests, mapped.context_requests, mapped.generation_requests) == (3, 1, 2)
    assert (mapped.context_tokens, mapped.paused_requests, mapped.micro_batch_id) == (128, 0, 0)
    assert (mapped.gpu_mem_bytes, mapped.cpu_mem_bytes, mapped.pinned_mem_bytes) == (10, 20, 30)
    assert (mapped.kv_cache.max_blocks, mapped.kv_cache.free_blocks, mapped.kv_cache.used_blocks) == (100, 60, 40)
    assert mapped.timestamp % 60 == pytest.approx(1.5)


# -- the executor over the fake engine --------------------------------------------------------------------------
def test_streams_exact_tokens_with_one_final(executor):
    request_id = executor.enqueue(GenerationRequest([11, 12], 5))
    steps = collect_until_final(executor, {request_id})
    assert [t for s in steps for t in s.token_ids] == fake_tokens([12], 5, vocab_size=1000)
    assert [s.is_final for s in steps].count(True) == 1 and steps[-1].finish_reason is FinishReason.LENGTH


def test_cancel_gives_a_cancelled_final_step(executor):
    request_id = executor.enqueue(GenerationRequest([1], 100000))
    time.sleep(0.02)
    executor.cancel(request_id)
    steps = collect_until_final(executor, {request_id})
    assert steps[-1].finish_reason is FinishReason.CANCELLED and steps[-1].token_ids == []


def test_stop_words_end_id_timeout_and_beams(executor):
    stop = executor.enqueue(GenerationRequest([10], 50, stop_words=[[13, 14]]))
    end = executor.enqueue(GenerationRequest([20], 50, end_id=23))
    timed = executor.enqueue(GenerationRequest([30], 100000, allotted_time_ms=30))
    beams = executor.enqueue(GenerationRequest([40], 2, beam_width=2))
    steps = collect_until_final(executor, {stop, end, timed, beams})
    by_id = {rid: [s for s in steps if s.request_id == rid] for rid in (stop, end, timed, beams)}
    assert [t for s in by_id[stop] for t in s.token_ids] == [11, 12, 13, 14]
    assert by_id[stop][-1].finish_reason is FinishReason.STOP_WORDS
    assert [t for s in by_id[end] for t in s.token_ids] == [21, 22] and by_id[end][-1].finish_reason is FinishReason.END_ID
    assert by_id[timed][-1].finish_reason is FinishReason.TIMED_OUT
    assert by_id[beams][-1].beams == [[41, 42], [43, 44]]


def test_num_return_sequences_keep_their_index(executor):
    request_id = executor.enqueue(GenerationRequest([100], 2, num_return_sequences=2))
    steps = collect_until_final(executor, {request_id})
    tokens = {index: [t for s in steps if s.sequence_index == index for t in s.token_ids] for index in (0, 1)}
    assert tokens == {0: fake_tokens([100], 2, 1000), 1: fake_tokens([100], 2, 1000, sequence=1)}
    assert [s.is_final for s in steps].count(True) == 1 and steps[-1].is_final


def test_engine_error_becomes_an_error_step(executor):
    request_id = executor.enqueue(GenerationRequest(list(range(300)), 4))  # the fake engine's max_input_len is 256
    steps = collect_until_final(executor, {request_id})
    assert steps == [steps[-1]] and steps[-1].finish_reason is FinishReason.ERROR
    assert "maximum input length" in steps[-1].error


def test_embedding_bias_goes_as_a_tensor(executor):
    pytest.importorskip("torch")
    bias = [0.0] * 1000
    bias[777] = 5.0
    request_id = executor.enqueue(GenerationRequest([1], 2, embedding_bias=bias))
    steps = collect_until_final(executor, {request_id})
    assert [t for s in steps for t in s.token_ids] == [777, 777]


def test_invalid_request_is_rejected_at_enqueue(executor):
    with pytest.raises(RequestRejected):
        executor.enqueue(GenerationRequest([1], 2, stop_words=[["x"]]))  # type: ignore[list-item]


def test_await_steps_blocks_for_the_timeout_without_work(executor):
    started = time.monotonic()
    assert executor.await_steps(0.2) == []
    assert 0.15 < time.monotonic() - started < 1.0


def test_iteration_stats_come_from_the_engine(executor):
    collect_until_final(executor, {executor.enqueue(GenerationRequest([1], 3))})
    stats = executor.iteration_stats()
    assert stats and stats[-1].kv_cache is not None and stats[-1].max_active_requests == 8
    assert executor.iteration_stats() == []


def test_shutdown_is_idempotent_and_later_calls_fail_clearly(executor):
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(ExecutorError, match="shut down"):
        executor.enqueue(GenerationRequest([1], 2))


def test_worker_rank_serves_nothing(tle, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    engine_dir = make_engine_dir(tmp_path / "e")
    (engine_dir / "rank1.engine").write_bytes(b"")
    worker, _ = create_executor({"executor": "trtllm_engine", "gpt_model_path": str(engine_dir)})
    try:
        assert worker.is_leader is False
        with pytest.raises(ExecutorError, match="worker"):
            worker.enqueue(GenerationRequest([1], 2))
        assert worker.await_steps(0.05) == [] and worker.iteration_stats() == []
    finally:
        worker.shutdown()


def test_vocab_size_comes_from_the_engine_config(executor):
    assert executor.vocab_size == 1000


def test_await_after_shutdown_is_quiet_not_a_failure(executor):
    executor.shutdown()
    assert executor.await_steps(0.01) == [] and executor.health_error() is None


def test_set_but_unapplied_nvidia_parameters_are_named_in_a_warning(tle, tmp_path, caplog):
    created, _ = create_executor({"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(tmp_path / "e")),
                                  "decoding_mode": "top_k_top_p", "lora_cache_max_adapter_size": "64",
                                  "cancellation_check_period_ms": "100", "medusa_choices": ""})
    created.shutdown()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["executor=trtllm_engine ignores these set parameters: decoding_mode, lora_cache_max_adapter_size"]


def test_an_engine_that_shuts_itself_down_is_reported_dead(tle, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_FATAL_TOKEN", "666")
    created, _ = create_executor({"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(tmp_path))})
    try:
        bystander = created.enqueue(GenerationRequest([5], 100000))
        fatal = created.enqueue(GenerationRequest([666], 10))
        steps = collect_until_final(created, {bystander, fatal})
        assert {s.request_id for s in steps if s.is_final and s.finish_reason is FinishReason.ERROR} == {
            bystander, fatal}
        assert "stopped accepting requests" in created.health_error()
        with pytest.raises(ExecutorError):
            created.enqueue(GenerationRequest([5], 2))
    finally:
        created.shutdown()


def test_lora_logits_and_perf_metrics_map_onto_the_request(tle):
    import numpy as np

    weights, config = np.ones((2, 8), np.float16), np.array([[1, 0, 4], [2, 0, 4]], np.int32)
    request = GenerationRequest([1], 4, lora_task_id=7, lora_weights=weights, lora_config=config,
                                return_context_logits=True, return_generation_logits=True, return_perf_metrics=True)
    trt = to_trt_request(tle, request)
    assert trt.lora_config.task_id == 7 and trt.lora_config.weights.shape == (2, 8)
    assert trt.lora_config.config.tolist() == config.tolist()
    out = trt.output_config
    assert out.return_context_logits and out.return_generation_logits and out.return_perf_metrics
    cached = to_trt_request(tle, GenerationRequest([1], 4, lora_task_id=7))  # the engine's cache holds the adapter
    assert cached.lora_config.task_id == 7 and cached.lora_config.weights is None
    assert to_trt_request(tle, GenerationRequest([1], 4)).lora_config is None


@pytest.mark.parametrize("streaming", [True, False])
def test_logits_and_kv_blocks_reach_the_step(executor, streaming):
    request_id = executor.enqueue(GenerationRequest([3, 4], 3, streaming=streaming, return_context_logits=True,
                                                    return_generation_logits=True, return_perf_metrics=True))
    steps = collect_until_final(executor, {request_id})
    context = [s.context_logits for s in steps if s.context_logits is not None]
    assert len(context) == len(steps) and context[0].shape == (2, 1000)
    generation = [s.generation_logits for s in steps if s.generation_logits is not None]
    tokens = [t for s in steps for t in s.token_ids]
    # [beams, tokens, vocab] whatever the engine's streaming layout; the fake puts 1.0 at each generated token.
    assert all(g.shape[0] == 1 and g.shape[2] == 1000 for g in generation)
    assert [int(i) for g in generation for i in g[0].argmax(axis=-1)] == tokens
    assert steps[-1].kv_cache_alloc_total_blocks == 1 and steps[-1].kv_cache_reused_blocks == 0


def test_guided_decoding_maps_onto_the_executor_and_the_request(tle):
    from trtllm_model.embedded.model_loading import load_tokenizer
    from trtllm_model.executors.trtllm_mapping import executor_config

    tokenizer = load_tokenizer()
    params = Params({"guided_decoding_backend": "xgrammar"}, accepted=["guided_decoding_backend"])
    guided = executor_config(tle, params, tokenizer=tokenizer).guided_decoding_config
    assert guided.backend is tle.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR
    assert len(guided.encoded_vocab) == len(tokenizer.get_vocab())
    assert [tokenizer.convert_tokens_to_ids(t) for t in guided.encoded_vocab[:50]] == list(range(50))
    assert guided.stop_token_ids == [tokenizer.eos_token_id] and guided.tokenizer_str.startswith("{")
    assert executor_config(tle, Params({})).guided_decoding_config is None
    with pytest.raises(ConfigError, match="tokenizer_dir"):
        executor_config(tle, params)
    trt = to_trt_request(tle, GenerationRequest([1], 4, guided_decoding_type="json_schema",
                                                guided_decoding_guide='{"type": "object"}'))
    assert trt.guided_decoding_params.guide_type is tle.GuidedDecodingParams.GuideType.JSON_SCHEMA
    assert trt.guided_decoding_params.guide == '{"type": "object"}'
    assert to_trt_request(tle, GenerationRequest([1], 4, guided_decoding_type="json")).guided_decoding_params.guide is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"end_id": 1000}, r"end_id=1000: must be within \[0, 1000\)"),
        ({"pad_id": -1}, "pad_id"),
        ({"stop_words": [[999, 1000]]}, "stop_words: token id 1000"),
        ({"bad_words": [[2**31]]}, "bad_words"),
        ({"embedding_bias": [float("inf")] * 1000}, "embedding_bias: value inf"),
        ({"top_k": 2**31}, "top_k"),
        ({"return_generation_logits": True, "max_tokens": 100000}, "max_logits_bytes=268435456"),
        ({"lora_task_id": 1, "lora_weights": "w", "lora_config": "c"}, "lora_weights: expected FP16 or FP32"),
        ({"guided_decoding_type": "json_schema", "guided_decoding_guide": "{"}, "guided_decoding_guide: not a JSON"),
    ],
)
def test_ids_outside_the_engine_vocabulary_are_refused_before_the_engine(executor, fields, message):
    """Issue 21: an id past the vocabulary indexes past a logits row on the GPU (a device-side assert)."""
    request = GenerationRequest([5], 2)
    for key, value in fields.items():
        setattr(request, key, value)
    with pytest.raises(RequestRejected, match=message) as error:
        executor.enqueue(request)
    assert not error.value.unsupported
    steps = collect_until_final(executor, {executor.enqueue(GenerationRequest([5], 2))})
    assert [t for s in steps for t in s.token_ids] == fake_tokens([5], 2, vocab_size=1000)


def test_lora_rows_must_pair_up(executor):
    import numpy as np

    request = GenerationRequest([1], 2, lora_task_id=7, lora_weights=np.ones((2, 8), np.float16),
                                lora_config=np.array([[1, 0, 4]], np.int32))
    with pytest.raises(RequestRejected, match="2 weight rows but 1 config rows"):
        executor.enqueue(request)
    request.lora_config = np.array([[1, 0, 4], [2, -1, 4]], np.int32)
    with pytest.raises(RequestRejected, match=r"lora_config: row \[2, -1, 4\]"):
        executor.enqueue(request)


def test_max_logits_bytes_is_a_model_parameter(tle, tmp_path):
    created, _ = create_executor({"executor": "trtllm_engine", "max_logits_bytes": "8000",
                                  "gpt_model_path": str(make_engine_dir(tmp_path / "engine", vocab_size=1000))})
    try:
        assert created.max_logits_bytes == 8000
        created.enqueue(GenerationRequest([5], 2, return_generation_logits=True))  # 2 x 1000 x 4 bytes
        with pytest.raises(RequestRejected, match="12000 bytes .* over max_logits_bytes=8000"):
            created.enqueue(GenerationRequest([5], 2, return_generation_logits=True, return_context_logits=True))
    finally:
        created.shutdown()
