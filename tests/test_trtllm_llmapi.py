"""trtllm_llmapi: parameters -> LLM(...), GenerationRequest -> SamplingParams, RequestOutput -> Steps, the executor."""

from __future__ import annotations

import importlib
import json
import time
from types import SimpleNamespace

import pytest
from trtllm_support import (
    collect_until_final,
    fake_tokens,
    forget_tensorrt_llm,
    make_checkpoint_dir,
    use_fake_tensorrt_llm,
)

from trtllm_model.executor_interface import ExecutorError, FinishReason, GenerationRequest, RequestRejected
from trtllm_model.executors import create_executor
from trtllm_model.executors.trtllm_llmapi_mapping import (
    OutputState,
    finish_reason,
    iteration_stats_from_json,
    kv_cache_kwargs,
    llm_kwargs,
    sampling_kwargs,
    steps_from_output,
)
from trtllm_model.params import ConfigError, Params


class ByteTokenizer:
    eos_token_id = pad_token_id = 256

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode()



@pytest.fixture(autouse=True)
def _forget_the_fake_afterwards():
    """Later tests (any module) must not find the fake tensorrt_llm in sys.modules."""
    yield
    forget_tensorrt_llm()

@pytest.fixture
def trtllm(monkeypatch):
    use_fake_tensorrt_llm(monkeypatch)
    return importlib.import_module("tensorrt_llm")


@pytest.fixture
def executor(trtllm, tmp_path):
    created, _ = create_executor({"executor": "trtllm_llmapi", "max_beam_width": "2", "max_batch_size": "8",
                                  "hf_model_path": str(make_checkpoint_dir(tmp_path / "model", vocab_size=5000))})
    yield created
    created.shutdown()


# -- configuration ----------------------------------------------------------------------------------------------
def test_parameters_map_onto_llm_keywords():
    params = Params({"hf_model_path": "/m", "tensor_parallel_size": "2", "pipeline_parallel_size": "1",
                     "max_batch_size": "32", "max_beam_width": "4", "enable_chunked_context": "true",
                     "kv_cache_free_gpu_mem_fraction": "0.8", "enable_kv_cache_reuse": "false",
                     "max_tokens_in_paged_kv_cache": "8192", "kv_cache_host_memory_bytes": "0"},
                    accepted={"hf_model_path", "tensor_parallel_size", "pipeline_parallel_size"})
    assert llm_kwargs(params) == {"model": "/m", "backend": "pytorch", "tensor_parallel_size": 2,
                                  "pipeline_parallel_size": 1, "max_batch_size": 32, "max_beam_width": 4,
                                  "enable_chunked_prefill": True, "enable_iter_perf_stats": True}
    no_stats = Params({"hf_model_path": "/m", "iter_stats_max_iterations": "0"}, accepted={"hf_model_path"})
    assert "enable_iter_perf_stats" not in llm_kwargs(no_stats)
    assert kv_cache_kwargs(params) == {"free_gpu_memory_fraction": 0.8, "max_tokens": 8192,
                                       "enable_block_reuse": False, "host_cache_size": 0}


def test_checkpoint_errors_name_the_cause_and_the_fix(trtllm, tmp_path):
    with pytest.raises(ConfigError, match="hf_model_path: required"):
        create_executor({"executor": "trtllm_llmapi"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json.*hf download"):
        create_executor({"executor": "trtllm_llmapi", "hf_model_path": str(tmp_path / "empty")})


def test_no_gpu_and_missing_package_errors(monkeypatch, tmp_path):
    checkpoint = str(make_checkpoint_dir(tmp_path / "m"))
    with pytest.raises(ConfigError, match="not installed"):
        create_executor({"executor": "trtllm_llmapi", "hf_model_path": checkpoint})
    use_fake_tensorrt_llm(monkeypatch)
    monkeypatch.setenv("FAKE_TRTLLM_GPU", "0")
    with pytest.raises(ExecutorError, match="no NVIDIA GPU driver"):
        create_executor({"executor": "trtllm_llmapi", "hf_model_path": checkpoint})


def test_kv_cache_parameters_reach_the_llm(trtllm, tmp_path):
    created, _ = create_executor({"executor": "trtllm_llmapi", "hf_model_path": str(make_checkpoint_dir(tmp_path)),
                                  "kv_cache_free_gpu_mem_fraction": "0.6"})
    try:
        assert created._llm.args.kv_cache_config.free_gpu_memory_fraction == 0.6
    finally:
        created.shutdown()


# -- request mapping --------------------------------------------------------------------------------------------
def test_generation_request_maps_onto_sampling_params_keywords(trtllm):
    request = GenerationRequest([1], 9, end_id=2, pad_id=0, temperature=0.5, top_k=3, top_p=0.8, seed=7,
                                min_tokens=1, repetition_penalty=1.2, presence_penalty=0.1, frequency_penalty=0.2,
                                length_penalty=1.1, return_log_probs=True, num_return_sequences=2,
                                stop_words=[[5], [104, 105]], bad_words=[[9]])
    kwargs = sampling_kwargs(request, ByteTokenizer())
    assert kwargs == {"max_tokens": 9, "end_id": 2, "pad_id": 0, "temperature": 0.5, "top_k": 3, "top_p": 0.8,
                      "seed": 7, "min_tokens": 1, "repetition_penalty": 1.2, "presence_penalty": 0.1,
                      "frequency_penalty": 0.2, "length_penalty": 1.1, "stop_token_ids": [5], "stop": ["hi"],
                      "bad_token_ids": [9], "logprobs": 1, "include_stop_str_in_output": True, "n": 2}
    trtllm.SamplingParams(**kwargs)  # the (strict) API takes every keyword


def test_beam_search_and_unsupported_fields():
    assert sampling_kwargs(GenerationRequest([1], 4, beam_width=3, num_return_sequences=2), None) == {
        "max_tokens": 4, "use_beam_search": True, "best_of": 3, "n": 2}
    with pytest.raises(RequestRejected, match="embedding_bias") as rejected:
        sampling_kwargs(GenerationRequest([1], 4, embedding_bias=[0.0]), None)
    assert rejected.value.unsupported
    assert sampling_kwargs(GenerationRequest([1], 4, embedding_bias=[0.5]), None, tuple)["embedding_bias"] == (0.5,)
    with pytest.raises(RequestRejected, match="tokenizer"):
        sampling_kwargs(GenerationRequest([1], 4, stop_words=[[1, 2]]), None)


@pytest.mark.parametrize(("reason", "stop_reason", "timed_out", "expected"), [
    (None, None, False, FinishReason.NOT_FINISHED), ("stop", None, False, FinishReason.END_ID),
    ("stop", 13, False, FinishReason.STOP_WORDS), ("stop", "</s>", False, FinishReason.STOP_WORDS),
    ("length", None, False, FinishReason.LENGTH), ("timeout", None, False, FinishReason.TIMED_OUT),
    ("cancelled", None, False, FinishReason.CANCELLED), ("cancelled", None, True, FinishReason.TIMED_OUT),
])
def test_finish_reasons_map(reason, stop_reason, timed_out, expected):
    assert finish_reason(reason, stop_reason, timed_out) is expected


# -- output mapping ---------------------------------------------------------------------------------------------
def _completion(index=0, diff=(), token_ids=(), reason=None, stop_reason=None, logprobs_diff=(), cum=None):
    return SimpleNamespace(index=index, token_ids_diff=list(diff), token_ids=list(token_ids), finish_reason=reason,
                           stop_reason=stop_reason, logprobs_diff=list(logprobs_diff), cumulative_logprob=cum)


def test_diffs_become_steps_and_the_last_is_final():
    state = OutputState(beam_search=False, want_log_probs=True)
    logprob = SimpleNamespace(logprob=-0.5, rank=1)
    first = SimpleNamespace(finished=False, outputs=[_completion(diff=[7], logprobs_diff=[{7: logprob}], cum=-0.5)])
    assert [(s.token_ids, s.log_probs, s.is_final) for s in steps_from_output(1, first, state)] == [([7], [-0.5], False)]
    last = SimpleNamespace(finished=True, outputs=[_completion(diff=[8], reason="length", logprobs_diff=[-0.25])])
    (step,) = steps_from_output(1, last, state)
    assert (step.token_ids, step.log_probs, step.is_final, step.finish_reason) == ([8], [-0.25], True,
                                                                                   FinishReason.LENGTH)


def test_top_log_probs_come_from_the_pytorch_backends_ranked_dicts():
    """logprobs=N: each token's dict holds the N likeliest (rank 1 first) and the sampled token, which may rank below
    them; the k likeliest come back, likeliest first. The TensorRT backend's plain floats name none."""
    state = OutputState(beam_search=False, want_log_probs=True, top_log_probs=2)
    entry = {9: SimpleNamespace(logprob=-3.0, rank=7), 4: SimpleNamespace(logprob=-0.1, rank=1),
             5: SimpleNamespace(logprob=-2.5, rank=2)}
    output = SimpleNamespace(finished=False, outputs=[_completion(diff=[9, 3], logprobs_diff=[entry, -0.4])])
    (step,) = steps_from_output(1, output, state)
    assert step.log_probs == [-3.0, -0.4] and step.top_log_probs == [[(4, -0.1), (5, -2.5)], []]
    assert sampling_kwargs(GenerationRequest([1], 4, num_top_log_probs=5), None)["logprobs"] == 5


def test_finished_sequences_are_not_repeated_and_the_request_end_is_one_final():
    state = OutputState(beam_search=False, want_log_probs=False)
    update = SimpleNamespace(finished=False, outputs=[_completion(0, [5], reason="stop"), _completion(1, [6])])
    steps = steps_from_output(3, update, state)
    assert [(s.sequence_index, s.finish_reason, s.is_final) for s in steps] == [
        (0, FinishReason.END_ID, False), (1, FinishReason.NOT_FINISHED, False)]
    update = SimpleNamespace(finished=True, outputs=[_completion(0, [], reason="stop"),
                                                     _completion(1, [], reason="cancelled")])
    steps = steps_from_output(3, update, state)
    assert [(s.sequence_index, s.token_ids, s.finish_reason, s.is_final) for s in steps] == [
        (1, [], FinishReason.CANCELLED, True)]


def test_beam_search_outputs_become_step_beams():
    state = OutputState(beam_search=True, want_log_probs=False)
    update = SimpleNamespace(finished=True, outputs=[_completion(0, token_ids=[1, 2], reason="length"),
                                                     _completion(1, token_ids=[1, 3], reason="length")])
    (step,) = steps_from_output(2, update, state)
    assert step.beams == [[1, 2], [1, 3]] and step.is_final and step.finish_reason is FinishReason.LENGTH


# -- the executor over the fake LLM API -------------------------------------------------------------------------
def test_streams_exact_tokens_with_one_final(executor):
    request_id = executor.enqueue(GenerationRequest([1000, 1200], 6))
    steps = collect_until_final(executor, {request_id})
    assert [t for s in steps for t in s.token_ids] == fake_tokens([1200], 6, 5000)
    assert [s.is_final for s in steps].count(True) == 1 and steps[-1].finish_reason is FinishReason.LENGTH


def test_cancel_aborts_with_a_cancelled_final(executor):
    request_id = executor.enqueue(GenerationRequest([1000], 3000))
    time.sleep(0.02)
    executor.cancel(request_id)
    steps = collect_until_final(executor, {request_id})
    assert steps[-1].finish_reason is FinishReason.CANCELLED and steps[-1].is_final
    assert len([t for s in steps for t in s.token_ids]) < 3000


def test_allotted_time_ends_with_timed_out(executor):
    steps = collect_until_final(executor, {executor.enqueue(GenerationRequest([1000], 3000, allotted_time_ms=30))})
    assert steps[-1].finish_reason is FinishReason.TIMED_OUT


def test_stop_words_of_several_tokens_use_the_llm_tokenizer(executor):
    # The fake tokenizer is byte-level below 256: [80, 81] is the stop string "PQ".
    request_id = executor.enqueue(GenerationRequest([77], 50, stop_words=[[80, 81]]))
    steps = collect_until_final(executor, {request_id})
    assert [t for s in steps for t in s.token_ids] == [78, 79, 80, 81]
    assert steps[-1].finish_reason is FinishReason.STOP_WORDS


def test_the_llm_api_does_not_detokenize_what_only_the_poller_reads(executor):
    # Its decode of each step would run in the stub for text nobody reads; stop strings keep it on.
    collect_until_final(executor, {executor.enqueue(GenerationRequest([1000], 2))})
    assert executor._llm.requests[-1][0].detokenize is False
    collect_until_final(executor, {executor.enqueue(GenerationRequest([77], 5, stop_words=[[80, 81]]))})
    assert executor._llm.requests[-1][0].detokenize is True


def test_end_of_sequence_beams_and_sequences(executor):
    eos = executor.enqueue(GenerationRequest([253], 50))  # the fake tokenizer's EOS is 256
    beams = executor.enqueue(GenerationRequest([1000], 2, beam_width=2))
    pair = executor.enqueue(GenerationRequest([1000], 2, num_return_sequences=2))
    steps = collect_until_final(executor, {eos, beams, pair})
    eos_steps = [s for s in steps if s.request_id == eos]
    assert [t for s in eos_steps for t in s.token_ids] == [254, 255]
    assert eos_steps[-1].finish_reason is FinishReason.END_ID
    assert [s for s in steps if s.request_id == beams][-1].beams == [[1001, 1002], [1003, 1004]]
    pair_steps = [s for s in steps if s.request_id == pair]
    assert sorted((s.sequence_index, t) for s in pair_steps for t in s.token_ids) == [(0, 1001), (0, 1002),
                                                                                     (1, 1008), (1, 1009)]
    assert [s.is_final for s in pair_steps] == [False] * (len(pair_steps) - 1) + [True]


def test_request_failure_is_an_error_step_and_the_executor_lives_on(trtllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_FAIL_TOKEN", "999")
    created, _ = create_executor({"executor": "trtllm_llmapi", "hf_model_path": str(make_checkpoint_dir(tmp_path))})
    try:
        failing = created.enqueue(GenerationRequest([999], 10))
        steps = collect_until_final(created, {failing})
        assert steps[-1].finish_reason is FinishReason.ERROR and "fake engine failure" in steps[-1].error
        fine = created.enqueue(GenerationRequest([1000], 2))
        assert [t for s in collect_until_final(created, {fine}) for t in s.token_ids] == [1001, 1002]
        assert created.health_error() is None
    finally:
        created.shutdown()


def test_embedding_bias_goes_as_a_tensor(executor):
    pytest.importorskip("torch")
    bias = [0.0] * 5000
    bias[4321] = 2.0
    steps = collect_until_final(executor, {executor.enqueue(GenerationRequest([1000], 2, embedding_bias=bias))})
    assert [t for s in steps for t in s.token_ids] == [4321, 4321]
    with pytest.raises(RequestRejected, match="vocab size"):
        executor.enqueue(GenerationRequest([1000], 2, embedding_bias=[1.0]))


def test_request_the_llm_refuses_is_rejected_at_enqueue(executor):
    with pytest.raises(RequestRejected, match="max_seq_len"):
        executor.enqueue(GenerationRequest([1], 100000))


def test_tokenizer_comes_from_the_llm_and_shutdown_is_idempotent(executor):
    assert executor.tokenizer().decode([72, 105]) == "Hi" and executor.vocab_size == 5000
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(ExecutorError, match="shut down"):
        executor.enqueue(GenerationRequest([1], 2))


def test_await_after_shutdown_is_quiet_not_a_failure(executor):
    executor.shutdown()
    assert executor.await_steps(0.01) == [] and executor.health_error() is None


def test_the_wrapped_hugging_face_tokenizer_is_handed_out(executor):
    hf_tokenizer = ByteTokenizer()
    executor._llm._tokenizer = SimpleNamespace(tokenizer=hf_tokenizer, encode=None, decode=None)
    assert executor.tokenizer() is hf_tokenizer


def test_engine_only_parameters_are_named_in_a_warning(trtllm, tmp_path, caplog):
    created, _ = create_executor({"executor": "trtllm_llmapi", "hf_model_path": str(make_checkpoint_dir(tmp_path)),
                                  "gpt_model_path": "/engines", "batch_scheduler_policy": "max_utilization",
                                  "stats_check_period_ms": "100"})
    created.shutdown()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["executor=trtllm_llmapi ignores these set parameters: batch_scheduler_policy, gpt_model_path"]


def test_iteration_stats_from_the_llm_json():
    entry = {"timestamp": "12-02-2026 12:00:01.250000", "iter": 9, "numActiveRequests": 2, "numQueuedRequests": 1,
             "maxNumActiveRequests": 64, "gpuMemUsage": 7, "cpuMemUsage": 8, "pinnedMemUsage": 9,
             "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 4, "usedNumBlocks": 6, "tokensPerBlock": 32},
             "inflightBatchingStats": {"numScheduledRequests": 2, "numContextRequests": 1, "numGenRequests": 1,
                                       "numPausedRequests": 0, "numCtxTokens": 50, "microBatchId": 0}}
    for stats in (entry, json.dumps(entry)):
        mapped = iteration_stats_from_json(stats)
        assert (mapped.iteration, mapped.active_requests, mapped.queued_requests, mapped.max_active_requests) == (
            9, 2, 1, 64)
        assert (mapped.scheduled_requests, mapped.context_requests, mapped.context_tokens) == (2, 1, 50)
        assert (mapped.gpu_mem_bytes, mapped.kv_cache.used_blocks, mapped.kv_cache.tokens_per_block) == (7, 6, 32)
        assert mapped.timestamp % 60 == pytest.approx(1.25)


def test_iteration_stats_only_after_the_first_request(executor, capsys):
    assert executor.iteration_stats() == []
    assert "not available" not in capsys.readouterr().out  # the LLM API's warning is not triggered
    collect_until_final(executor, {executor.enqueue(GenerationRequest([1000], 3))})
    stats = executor.iteration_stats()
    assert stats and stats[-1].kv_cache is not None and stats[-1].max_active_requests == 8
    assert executor.iteration_stats() == []


def test_shutdown_ends_live_requests(executor):
    request_id = executor.enqueue(GenerationRequest([1000], 3000))
    time.sleep(0.02)
    executor.shutdown()
    steps = executor.await_steps(0.01)
    assert steps and steps[-1].request_id == request_id and steps[-1].is_final
    assert steps[-1].finish_reason is FinishReason.CANCELLED


def test_beam_log_probs_come_for_every_beam():
    from trtllm_model.executors.trtllm_llmapi_mapping import OutputState, steps_from_output

    class Completion:
        def __init__(self, index, tokens, log_probs):
            self.index, self.token_ids, self.logprobs = index, tokens, log_probs
            self.cumulative_logprob, self.finish_reason, self.stop_reason = sum(log_probs), "length", None

    class Output:
        finished = True
        outputs = [Completion(0, [5, 6], [-0.5, -0.25]), Completion(1, [5, 7], [-0.5, -1.0])]

    [step] = steps_from_output(1, Output(), OutputState(beam_search=True, want_log_probs=True))
    assert step.beams == [[5, 6], [5, 7]] and step.is_final
    assert step.beam_log_probs == [[-0.5, -0.25], [-0.5, -1.0]] and step.beam_cum_log_probs == [-0.75, -1.5]


@pytest.mark.parametrize("streaming", [True, False])
def test_logits_reach_the_step(executor, streaming):
    request_id = executor.enqueue(GenerationRequest([1000, 1200], 4, streaming=streaming, return_context_logits=True,
                                                    return_generation_logits=True))
    steps = collect_until_final(executor, {request_id})
    context = [s.context_logits for s in steps if s.context_logits is not None]
    assert context and all(c.shape == (2, 5000) for c in context)  # the LLM API keeps them on the output
    generation = [s.generation_logits for s in steps if s.generation_logits is not None]
    tokens = [t for s in steps for t in s.token_ids]
    assert all(g.shape[0] == 1 and g.shape[2] == 5000 for g in generation)
    assert [int(i) for g in generation for i in g[0].argmax(axis=-1)] == tokens == fake_tokens([1200], 4, 5000)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input_ids": [5000]}, r"input_ids: token id 5000 is outside the vocabulary \[0, 5000\)"),
        ({"end_id": 5000, "min_tokens": 2}, "end_id=5000"),
        ({"stop_words": [[4999, 5000]]}, "stop_words: token id 5000"),
        ({"max_tokens": 2**31}, "request_output_len"),
        ({"return_context_logits": True, "input_ids": [1] * 20000}, "return_context_logits: 400000000 bytes"),
    ],
)
def test_ids_outside_the_checkpoint_vocabulary_are_refused_before_the_llm(executor, fields, message):
    request = GenerationRequest([5], 2)
    for key, value in fields.items():
        setattr(request, key, value)
    with pytest.raises(RequestRejected, match=message):
        executor.enqueue(request)
    steps = collect_until_final(executor, {executor.enqueue(GenerationRequest([5], 2))})
    assert len([t for s in steps for t in s.token_ids]) == 2 and executor.health_error() is None


# -- NVIDIA's LLM API convention over the strict fake: LoRA inputs and model.yaml's logits post-processors ------

@pytest.fixture
def yaml_executor(trtllm, tmp_path, monkeypatch):
    """trtllm_llmapi as model.yaml builds it, with a post-processor module NVIDIA's way ('module.path:attribute')."""
    from trtllm_model.executors.trtllm_llmapi import create_from_model_yaml
    from trtllm_model.model_yaml import LlmApiConfig, TritonConfig

    (tmp_path / "my_processors.py").write_text(
        "class Upper:\n    def __call__(self, req_id, logits, token_ids, stream_ptr, client_id):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = LlmApiConfig(tmp_path / "model.yaml", TritonConfig(), "trtllm_llmapi",
                          {"model": str(make_checkpoint_dir(tmp_path / "model", vocab_size=5000)),
                           "lora_config": {"max_lora_rank": 8}},
                          {"upper": "my_processors:Upper"})
    created, _ = create_from_model_yaml(config, {})
    yield created
    created.shutdown()


def _llmapi_parse(executor, **tensors):
    import numpy as np

    from trtllm_model.conventions import llmapi
    from trtllm_model.conventions.common import Limits

    options = llmapi.LlmApiOptions(logits_post_processors=frozenset({"upper"}),
                                   executor_features=executor.llmapi_features)
    arrays = {"text_input": np.array([b"hi"], dtype=object), "sampling_param_max_tokens": np.array([3], np.int32)}
    for name, value in tensors.items():
        arrays[name] = (np.array([value], np.uint64) if name == "lora_id" else np.array([value.encode()], dtype=object))
    return llmapi.parse_request(arrays, Limits(executor_name="trtllm_llmapi"), executor.tokenizer(), options)


def test_lora_inputs_reach_generate_async_as_a_lora_request(yaml_executor, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    parsed = _llmapi_parse(yaml_executor, lora_id=7, lora_name="sql", lora_path=str(adapter), lora_ckpt_source="nemo")
    steps = collect_until_final(yaml_executor, {yaml_executor.enqueue(parsed.generation)})
    assert steps[-1].is_final and steps[-1].error is None
    _, lora = yaml_executor._llm.requests[-1]
    assert (type(lora).__name__, lora.lora_int_id, lora.lora_name, lora.lora_path, lora.lora_ckpt_source) == (
        "LoRARequest", 7, "sql", str(adapter), "nemo")
    collect_until_final(yaml_executor, {yaml_executor.enqueue(_llmapi_parse(yaml_executor).generation)})
    assert yaml_executor._llm.requests[-1][1] is None  # no LoRA inputs, no adapter


def test_lora_path_that_does_not_exist_is_invalid_arg_naming_it(yaml_executor):
    from trtllm_model.conventions.common import InvalidInput

    with pytest.raises(InvalidInput, match="/no/such/adapter") as raised:
        _llmapi_parse(yaml_executor, lora_id=1, lora_name="a", lora_path="/no/such/adapter")
    assert not raised.value.unsupported


def test_lora_path_is_refused_unlooked_at_when_the_llm_takes_no_lora(trtllm, tmp_path):
    from trtllm_model.conventions.common import InvalidInput
    from trtllm_model.executors.trtllm_llmapi import create_from_model_yaml
    from trtllm_model.model_yaml import LlmApiConfig, TritonConfig

    config = LlmApiConfig(tmp_path / "model.yaml", TritonConfig(), "trtllm_llmapi",
                          {"model": str(make_checkpoint_dir(tmp_path / "model", vocab_size=5000))}, {})
    executor, _ = create_from_model_yaml(config, {})
    try:
        answers = []
        for path in (str(tmp_path), "/no/such/adapter"):  # one exists, one does not: the same answer
            with pytest.raises(InvalidInput) as raised:
                _llmapi_parse(executor, lora_id=1, lora_name="a", lora_path=path)
            assert raised.value.unsupported
            answers.append(str(raised.value))
        assert answers[0] == answers[1] and "lora_config" in answers[0]
    finally:
        executor.shutdown()


@pytest.mark.parametrize("given", [{"lora_id": 1}, {"lora_name": "a"}, {"lora_path": "/tmp"},
                                   {"lora_id": 1, "lora_name": "a"}, {"lora_name": "a", "lora_path": "/tmp"},
                                   {"lora_ckpt_source": "hf"}])
def test_only_some_lora_inputs_is_invalid_arg(yaml_executor, given):
    from trtllm_model.conventions.common import InvalidInput

    with pytest.raises(InvalidInput, match="lora_id, lora_name and lora_path") as raised:
        _llmapi_parse(yaml_executor, **given)
    assert not raised.value.unsupported
    assert yaml_executor._llm.requests == []


def test_named_logits_post_processor_from_model_yaml_reaches_sampling_params(yaml_executor):
    parsed = _llmapi_parse(yaml_executor, sampling_param_logits_post_processor_name="upper")
    steps = collect_until_final(yaml_executor, {yaml_executor.enqueue(parsed.generation)})
    assert steps[-1].is_final and steps[-1].error is None
    params, _ = yaml_executor._llm.requests[-1]
    assert type(params.logits_processor).__name__ == "Upper"  # the class, instantiated once at load
    first = params.logits_processor
    collect_until_final(yaml_executor, {yaml_executor.enqueue(parsed.generation)})
    assert yaml_executor._llm.requests[-1][0].logits_processor is first


def test_unknown_logits_post_processor_name_is_invalid_arg_listing_the_declared(yaml_executor):
    from trtllm_model.conventions.common import InvalidInput

    with pytest.raises(InvalidInput, match="'nope': unknown.*available: upper"):
        _llmapi_parse(yaml_executor, sampling_param_logits_post_processor_name="nope")


@pytest.mark.parametrize(("spec", "message"), [("my_processors", "expected 'module.path:attribute'"),
                                               ("no_such_module:x", "cannot load it"),
                                               ("json:__doc__", "not callable")])
def test_logits_post_processor_that_cannot_load_fails_at_load_naming_it(trtllm, spec, message):
    from trtllm_model.executors.trtllm_llmapi import load_logits_post_processors

    with pytest.raises(ConfigError, match=rf"logits_post_processors\['bad'\].*{message}"):
        load_logits_post_processors({"bad": spec})
