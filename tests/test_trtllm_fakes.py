"""The fake tensorrt_llm rejects what the real API rejects and behaves like it where the adapters depend on it."""

from __future__ import annotations

import asyncio
import importlib
import time
from datetime import timedelta

import pytest
from trtllm_support import fake_tokens, forget_tensorrt_llm, make_checkpoint_dir, make_engine_dir, use_fake_tensorrt_llm


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
def engine(tle, tmp_path):
    executor = tle.Executor(str(make_engine_dir(tmp_path / "engine")), tle.ModelType.DECODER_ONLY,
                            tle.ExecutorConfig(max_beam_width=2, iter_stats_max_iterations=5))
    yield executor
    executor.shutdown()


def responses_until_final(executor, request_id: int, timeout_s: float = 10.0) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while not out or out[-1].has_error() or not out[-1].result.is_final:
        if out and out[-1].has_error():
            break
        assert time.monotonic() < deadline
        out += executor.await_responses(request_id, timeout=timedelta(seconds=1))
    return out


# -- signatures the real binding enforces ---------------------------------------------------------------------
def test_request_arguments_after_max_tokens_are_keyword_only(tle):
    with pytest.raises(TypeError):
        tle.Request([1, 2], 4, True)
    with pytest.raises(TypeError):
        tle.SamplingConfig(1, 5)  # top_k positionally
    assert tle.Request([1, 2], 4, streaming=True).streaming is True


def test_unknown_keywords_and_wrong_types_are_rejected(tle):
    with pytest.raises(TypeError):
        tle.Request([1], 4, max_new_tokens=3)
    with pytest.raises(TypeError):
        tle.SamplingConfig(1, random_seed=3)  # the old spelling; 1.2 says seed
    with pytest.raises(TypeError):
        tle.Request([1], 4, stop_words=[5, 6])  # must be list[list[int]]
    with pytest.raises(TypeError):
        tle.Request([1], 4, embedding_bias=[0.0, 1.0])  # a tensor, not a list
    with pytest.raises(TypeError):
        tle.Request([1], 4, allotted_time_ms=500)  # std::chrono::milliseconds: a timedelta


def test_int_timeout_selects_the_request_id_overload(engine, tle):
    first = engine.enqueue_request(tle.Request([10], 2, streaming=True))
    second = engine.enqueue_request(tle.Request([20], 2, streaming=True))
    with pytest.raises(TypeError):
        engine.await_responses(timeout=1)  # a bare int is not a duration
    time.sleep(0.05)
    only_second = engine.await_responses(second)  # an int positionally is a request id, not seconds
    assert only_second and {r.request_id for r in only_second} == {second}
    rest = engine.await_responses(timedelta(seconds=1))
    assert {r.request_id for r in rest} == {first}


def test_has_error_is_a_method_and_the_other_case_raises(engine, tle):
    ok = responses_until_final(engine, engine.enqueue_request(tle.Request([1], 1, streaming=True)))[-1]
    assert callable(ok.has_error) and ok.has_error() is False
    with pytest.raises(RuntimeError):
        _ = ok.error_msg
    bad = responses_until_final(engine, engine.enqueue_request(tle.Request(list(range(300)), 1)))[-1]
    assert bad.has_error() is True and "exceeds maximum input length" in bad.error_msg
    with pytest.raises(RuntimeError):
        _ = bad.result


def test_executor_needs_config_json_and_a_rank_engine(tle, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="config.json"):
        tle.Executor(str(tmp_path / "empty"), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig())
    (make_engine_dir(tmp_path / "e") / "rank0.engine").unlink()
    with pytest.raises(RuntimeError, match="rank0.engine"):
        tle.Executor(str(tmp_path / "e"), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig())


def test_older_builder_layout_loads_with_its_engine_file_name(tle, tmp_path):
    directory = make_engine_dir(tmp_path / "old", vocab_size=500, max_input_len=64, max_seq_len=128,
                                layout="builder_config")
    executor = tle.Executor(str(directory), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig())
    try:
        assert (executor.vocab_size, executor.max_input_len, executor.max_seq_len) == (500, 64, 128)
    finally:
        executor.shutdown()
    (directory / "llama_float16_tp1_rank0.engine").unlink()
    with pytest.raises(RuntimeError, match="llama_float16_tp1_rank0.engine"):
        tle.Executor(str(directory), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig())


def test_engine_cuts_max_tokens_to_what_max_seq_len_leaves(tle, tmp_path):
    # The real executor warns and generates fewer tokens: only a check before enqueue can tell the client.
    directory = make_engine_dir(tmp_path / "e", max_input_len=64, max_seq_len=70)
    executor = tle.Executor(str(directory), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig())
    try:
        request_id = executor.enqueue_request(tle.Request(list(range(1, 61)), 50, streaming=False))
        final = responses_until_final(executor, request_id)[-1]
        assert not final.has_error() and len(final.result.output_token_ids[0]) == 60 + 10
    finally:
        executor.shutdown()


def test_no_gpu_makes_the_import_fail_like_the_real_package(monkeypatch):
    use_fake_tensorrt_llm(monkeypatch)
    monkeypatch.setenv("FAKE_TRTLLM_GPU", "0")
    with pytest.raises(ImportError, match="libcuda"):
        importlib.import_module("tensorrt_llm.bindings.executor")


# -- behaviour --------------------------------------------------------------------------------------------------
def test_streaming_sends_deltas_then_a_final_with_reason(engine, tle):
    request_id = engine.enqueue_request(tle.Request([100, 41], 4, streaming=True))
    out = responses_until_final(engine, request_id)
    assert [r.result.output_token_ids for r in out] == [[[t]] for t in fake_tokens([41], 4)]
    assert [r.result.is_final for r in out] == [False, False, False, True]
    assert out[-1].result.finish_reasons == [tle.FinishReason.LENGTH]


def test_end_id_ends_without_the_end_token_and_stop_words_stay(engine, tle):
    out = responses_until_final(engine, engine.enqueue_request(tle.Request([41], 10, streaming=True, end_id=44)))
    assert [t for r in out for t in r.result.output_token_ids[0]] == [42, 43]
    assert out[-1].result.finish_reasons == [tle.FinishReason.END_ID]
    out = responses_until_final(engine, engine.enqueue_request(
        tle.Request([41], 10, streaming=True, stop_words=[[43, 44]])))
    assert [t for r in out for t in r.result.output_token_ids[0]] == [42, 43, 44]
    assert out[-1].result.finish_reasons == [tle.FinishReason.STOP_WORDS]


def test_cancel_ends_with_a_final_response_of_zero_new_tokens(engine, tle):
    request_id = engine.enqueue_request(tle.Request([5], 100000, streaming=True))
    time.sleep(0.02)
    engine.cancel_request(request_id)
    out = responses_until_final(engine, request_id)
    assert out[-1].result.output_token_ids == [[]]
    assert out[-1].result.finish_reasons == [tle.FinishReason.CANCELLED]


def test_allotted_time_ends_with_timed_out(engine, tle):
    request = tle.Request([5], 100000, streaming=True, allotted_time_ms=timedelta(milliseconds=30))
    out = responses_until_final(engine, engine.enqueue_request(request))
    assert out[-1].result.finish_reasons == [tle.FinishReason.TIMED_OUT]


def test_beam_search_sends_every_beam_in_full_each_time(engine, tle):
    request = tle.Request([10], 3, streaming=True, sampling_config=tle.SamplingConfig(2))
    out = responses_until_final(engine, engine.enqueue_request(request))
    assert [r.result.output_token_ids for r in out] == [[[11], [12]], [[11, 12], [13, 14]], [[11, 12, 13], [14, 15, 16]]]


def test_log_probs_and_iteration_stats(engine, tle):
    request = tle.Request([10], 7, streaming=True, output_config=tle.OutputConfig(return_log_probs=True))
    out = responses_until_final(engine, engine.enqueue_request(request))
    assert out[0].result.log_probs == [[-0.2]]  # token 11: -((11 % 5) + 1) / 10
    stats = engine.get_latest_iteration_stats()
    assert 1 <= len(stats) <= 5  # at most iter_stats_max_iterations
    assert stats[-1].iter >= 7 and stats[-1].kv_cache_stats.tokens_per_block > 0
    assert engine.get_latest_iteration_stats() == []


def test_worker_ranks_cannot_enqueue(tle, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    engine_dir = make_engine_dir(tmp_path / "e")
    (engine_dir / "rank1.engine").write_bytes(b"")
    with tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig()) as worker:
        assert worker.can_enqueue_requests() is False
        with pytest.raises(RuntimeError):
            worker.enqueue_request(tle.Request([1], 1))


# -- LLM API ----------------------------------------------------------------------------------------------------
@pytest.fixture
def llm_module(monkeypatch):
    use_fake_tensorrt_llm(monkeypatch)
    return importlib.import_module("tensorrt_llm")


def test_sampling_params_are_keyword_only_and_llm_rejects_unknown_options(llm_module, tmp_path):
    with pytest.raises(TypeError):
        llm_module.SamplingParams(8)
    with pytest.raises(TypeError):
        llm_module.SamplingParams(max_new_tokens=8)
    with pytest.raises(ValueError, match="Extra inputs"):
        llm_module.LLM(str(make_checkpoint_dir(tmp_path / "m")), max_tokens_in_paged_kv_cache=10)


def test_async_iteration_needs_generate_async_on_the_loop(llm_module, tmp_path):
    llm = llm_module.LLM(str(make_checkpoint_dir(tmp_path / "m")))
    try:
        output = llm.generate_async([5], llm_module.SamplingParams(max_tokens=2), streaming=True)
        with pytest.raises(RuntimeError, match="event loop"):
            output.__aiter__()
    finally:
        llm.shutdown()


def test_llm_streams_diffs_and_abort_ends_cancelled(llm_module, tmp_path):
    llm = llm_module.LLM(str(make_checkpoint_dir(tmp_path / "m")))

    async def run() -> tuple[list, tuple]:
        output = llm.generate_async({"prompt_token_ids": [1000]}, llm_module.SamplingParams(max_tokens=3),
                                    streaming=True)
        diffs = [list(step.outputs[0].token_ids_diff) async for step in output]
        endless = llm.generate_async([1000], llm_module.SamplingParams(max_tokens=1000), streaming=True)
        async for _step in endless:
            endless.abort()
        last = endless.outputs[0]
        return diffs, (last.finish_reason, list(last.token_ids_diff), endless.finished)

    try:
        diffs, cancelled = asyncio.run(run())
    finally:
        llm.shutdown()
    assert diffs == [[1001], [1002], [1003]]
    assert cancelled == ("cancelled", [], True)


def test_llm_args_hold_the_resolved_limits_and_generate_async_enforces_them(monkeypatch, tmp_path):
    use_fake_tensorrt_llm(monkeypatch)
    trtllm = importlib.import_module("tensorrt_llm")
    llm = trtllm.LLM(str(make_checkpoint_dir(tmp_path, max_position_embeddings=300)), max_num_tokens=100)
    try:
        assert (llm.args.max_num_tokens, llm.args.max_beam_width, llm.args.max_seq_len) == (100, 1, None)
        with pytest.raises(ValueError, match=r"should not exceed max_num_tokens \(100\)"):
            llm.generate_async([1] * 101, trtllm.SamplingParams(max_tokens=1), streaming=True)
        with pytest.raises(ValueError, match=r"max_seq_len \(300\)"):
            llm.generate_async([1] * 50, trtllm.SamplingParams(max_tokens=251), streaming=True)
    finally:
        llm.shutdown()
