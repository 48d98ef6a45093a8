"""End to end: a real tritonserver serving executor=trtllm_engine and executor=trtllm_llmapi over the fake
tensorrt_llm, installed on the model's path: exact streamed tokens, one final, cancel with `stop`.

The Python backend stub runs an isolated interpreter (PYTHONPATH is ignored), but it puts the model's version
directory on sys.path: the fake package is copied there, where the model's own imports find it.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server, write_repository
from triton_client import StreamClient, stream_once, text_inputs, token_inputs
from trtllm_support import FAKES_DIR, fake_tokens, make_checkpoint_dir, make_engine_dir

pytestmark = pytest.mark.e2e

# The project repository's synthetic-only parameters; other executors reject them as unknown.
SYNTHETIC_PARAMETER = re.compile(r'parameters: \{\s*key: "synthetic_\w+"\s*value: \{ string_value: "[^"]*" \}\s*\}\n')
FAKE_ENVIRONMENT = {"FAKE_TRTLLM_STEP_MS": "2"}
UNSET_LIMITS = {"max_input_len": "", "max_output_len": "", "max_batch_size": ""}


def repository_with_fake(workdir: Path, parameters: dict[str, str], models: tuple[str, ...]) -> Path:
    repository = write_repository(workdir / "repository", parameters, models)
    config = repository / "tensorrt_llm" / "config.pbtxt"
    config.write_text(SYNTHETIC_PARAMETER.sub("", config.read_text()))
    shutil.copytree(FAKES_DIR / "tensorrt_llm", repository / "tensorrt_llm" / "1" / "tensorrt_llm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return repository


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trtllm_engine")
    engine_dir = make_engine_dir(workdir / "engine")
    # The project's config.pbtxt limits (4096 tokens in, 32 requests) are over this engine's: unset, the engine's
    # own limits apply (max_input_len 256, max_seq_len 4096, max_batch_size 8).
    parameters = {"executor": "trtllm_engine", "gpt_model_path": str(engine_dir), "max_beam_width": "2",
                  "kv_cache_free_gpu_mem_fraction": "0.9", "gpt_model_type": "inflight_fused_batching",
                  **UNSET_LIMITS}
    repository = repository_with_fake(workdir, parameters, ("tensorrt_llm",))
    server = start_server(workdir, executor="trtllm_engine", env=FAKE_ENVIRONMENT, repository=repository)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llmapi_server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trtllm_llmapi")
    checkpoint = make_checkpoint_dir(workdir / "checkpoint")
    parameters = {"executor": "trtllm_llmapi", "hf_model_path": str(checkpoint)}
    repository = repository_with_fake(workdir, parameters, ("tensorrt_llm",))
    server = start_server(workdir, executor="trtllm_llmapi", env=FAKE_ENVIRONMENT, repository=repository)
    yield server
    server.stop()


def finish_reasons(result) -> list[str]:
    return [r.as_numpy("finish_reason").reshape(-1)[0].decode() for r in result.responses
            if r.as_numpy("finish_reason") is not None]


def assert_cancel_with_stop_ends_the_stream(server) -> None:
    """NVIDIA's `stop` input (same request id, stop=True) cancels a long request; its stream ends normally."""
    streams, stopper = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        long = streams.send("tensorrt_llm", token_inputs([1000], 4000), "long-request")
        deadline = time.monotonic() + 30
        while not long.responses and not long.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert long.responses, f"no token before the cancel: {long.errors}"
        stopper.send("tensorrt_llm", [*token_inputs([1000], 1), _stop()], "long-request").wait(30)
        long.wait(60)
    finally:
        streams.close()
        stopper.close()
    tokens = long.tokens()
    assert 0 < len(tokens) < 4000 and tokens == fake_tokens([1000], len(tokens))
    assert long.finals == 1 and long.errors == []  # a stopped request ends normally, as in NVIDIA's model


def _stop():
    from triton_client import tensor

    return tensor("stop", True, np.bool_)


# -- executor=trtllm_engine -------------------------------------------------------------------------------------
def test_engine_streams_exact_tokens_with_one_final(engine_server):
    inputs = token_inputs([5, 6, 7], 12, return_finish_reason=(True, np.bool_))
    result = stream_once(engine_server.grpc_url, "tensorrt_llm", inputs)
    assert result.errors == []
    assert result.tokens() == fake_tokens([7], 12)
    assert result.finals == 1 and finish_reasons(result)[-1] == "length"


def test_engine_non_streaming_with_the_prompt(engine_server):
    inputs = token_inputs([5, 6], 4, streaming=False, exclude_input_in_output=(False, np.bool_))
    result = stream_once(engine_server.grpc_url, "tensorrt_llm", inputs)
    assert result.errors == [] and result.tokens() == [5, 6, *fake_tokens([6], 4)] and len(result.responses) == 1


def test_engine_end_id_and_engine_errors_reach_the_client(engine_server):
    ended = stream_once(engine_server.grpc_url, "tensorrt_llm", token_inputs([40], 50, end_id=(44, np.int32)))
    assert ended.tokens() == [41, 42, 43] and ended.errors == []
    # A bias of the wrong length passes our checks; the engine refuses it with its own error.
    biased = stream_once(engine_server.grpc_url, "tensorrt_llm",
                         token_inputs([40], 4, embedding_bias=([1.0, 0.0], np.float32)))
    assert biased.finals == 1 and any("vocab size is 32000" in error for error in biased.errors)


def assert_limits_refuse_with_invalid_arg(server, refused: dict[str, list], expected: dict[str, str]) -> None:
    """Each request past a limit ends with one INVALID_ARG final naming the field and both numbers (the engine
    would have answered otherwise: its own error, or silently fewer tokens); the server serves on."""
    for name, inputs in refused.items():
        result = stream_once(server.grpc_url, "tensorrt_llm", inputs)
        assert result.finals == 1 and result.tokens() == [], f"{name}: {result.errors}"
        assert result.errors == [f"INVALID_ARG: {expected[name]}"], name
    served = stream_once(server.grpc_url, "tensorrt_llm", token_inputs(list(range(1, 101)), 8))
    assert served.errors == [] and served.tokens() == fake_tokens([100], 8)


def test_engine_build_limits_refuse_before_enqueue(engine_server):
    # make_engine_dir's engine: max_input_len 256, max_seq_len 4096; the config's max_beam_width is 2.
    assert_limits_refuse_with_invalid_arg(
        engine_server,
        {"prompt": token_inputs(list(range(1, 258)), 4),
         "sequence": token_inputs(list(range(1, 101)), 3997),
         "beams": token_inputs([10], 3, beam_width=(3, np.int32))},
        {"prompt": "input_ids: prompt of 257 tokens is over max_input_len=256",
         "sequence": "request_output_len=3997: with the prompt's 100 tokens that is 4097, over max_seq_len=4096",
         "beams": "beam_width=3: over max_beam_width=2"},
    )


def test_engine_banner_lists_only_the_loaded_model(engine_server):
    # The repository holds tensorrt_llm alone (as `configure --no-ensemble` writes it).
    log = engine_server.log()
    assert "trtllm-triton: ready. models: tensorrt_llm\n" in log
    banner = log[log.index("trtllm-triton: ready."):]
    assert "POST /v2/models/tensorrt_llm/generate_stream" in banner and "ensemble" not in banner


def test_config_limit_over_the_engine_fails_the_load_naming_both(tmp_path):
    engine_dir = make_engine_dir(tmp_path / "engine", max_input_len=256)
    parameters = {"executor": "trtllm_engine", "gpt_model_path": str(engine_dir), "max_input_len": "4096"}
    repository = repository_with_fake(tmp_path, parameters, ("tensorrt_llm",))
    server = start_server(tmp_path / "server", executor="trtllm_engine", env=FAKE_ENVIRONMENT,
                          repository=repository, expect_ready=False)
    assert server.process.wait(120) != 0
    assert "parameter max_input_len=4096 is larger than max_input_len=256, what the engine in" in server.log()


def test_engine_beams_arrive_whole(engine_server):
    result = stream_once(engine_server.grpc_url, "tensorrt_llm",
                         token_inputs([10], 3, beam_width=(2, np.int32)))
    last = result.responses[-1].as_numpy("output_ids")
    assert last.reshape(2, -1).tolist() == [[11, 12, 13], [14, 15, 16]]


def test_engine_cancel_with_stop(engine_server):
    assert_cancel_with_stop_ends_the_stream(engine_server)


def test_engine_death_ends_every_stream_and_the_model_stops_being_ready(tmp_path):
    parameters = {"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(tmp_path / "engine")),
                  **UNSET_LIMITS}
    repository = repository_with_fake(tmp_path, parameters, ("tensorrt_llm",))
    server = start_server(tmp_path / "server", executor="trtllm_engine", repository=repository,
                          env={**FAKE_ENVIRONMENT, "FAKE_TRTLLM_FATAL_TOKEN": "666"})
    client = StreamClient(server.grpc_url)
    try:
        victim = client.send("tensorrt_llm", token_inputs([5], 4000), "victim")
        time.sleep(0.2)
        fatal = client.send("tensorrt_llm", token_inputs([666], 10), "fatal")
        for result in (victim, fatal):
            assert result.wait(30).finals == 1 and result.errors, "a stream was left hanging"
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + 15
        while grpc_client.is_model_ready("tensorrt_llm"):
            assert time.monotonic() < deadline, "model still reports ready with a dead engine"
            time.sleep(0.1)
    finally:
        client.close()
        server.stop()


# -- executor=trtllm_llmapi -------------------------------------------------------------------------------------
def test_llmapi_streams_exact_tokens_with_one_final(llmapi_server):
    result = stream_once(llmapi_server.grpc_url, "tensorrt_llm", token_inputs([1000, 2000], 9))
    assert result.errors == []
    assert result.tokens() == fake_tokens([2000], 9)
    assert result.finals == 1


def test_llmapi_text_with_the_llm_tokenizer(llmapi_server):
    # The fake tokenizer is byte-level: "ab" ends in 98, so the model continues with bytes 99, 100, 101.
    result = stream_once(llmapi_server.grpc_url, "tensorrt_llm", text_inputs("ab", 3))
    assert result.errors == [] and result.text() == "cde"


def test_llmapi_cancel_with_stop(llmapi_server):
    assert_cancel_with_stop_ends_the_stream(llmapi_server)


def test_llmapi_limits_refuse_before_enqueue(llmapi_server):
    # The checkpoint's max_position_embeddings is 4096; LLM(max_beam_width) is left at its default, 1.
    assert_limits_refuse_with_invalid_arg(
        llmapi_server,
        {"sequence": token_inputs(list(range(1, 101)), 3997), "beams": token_inputs([10], 3, beam_width=(2, np.int32))},
        {"sequence": "request_output_len=3997: with the prompt's 100 tokens that is 4097, over max_seq_len=4096",
         "beams": "beam_width=2: over max_beam_width=1"},
    )


def test_top_log_probs_from_the_llm_api_and_refused_by_the_executor_api(llmapi_server, engine_server):
    """num_top_log_probs: the LLM API returns the likeliest tokens (SamplingParams.logprobs=N; the fake's: the
    sampled token first, then the ids after it); TensorRT-LLM's executor API has none: UNSUPPORTED, naming it."""
    result = stream_once(llmapi_server.grpc_url, "tensorrt_llm", token_inputs(
        [1000, 2000], 3, num_top_log_probs=(3, np.int32), return_log_probs=(True, np.bool_)))
    assert result.errors == []
    tokens = fake_tokens([2000], 3)
    ids = np.concatenate([r.as_numpy("output_top_log_prob_ids") for r in result.responses if r.as_numpy(
        "output_top_log_prob_ids") is not None], axis=2)
    assert ids.shape == (1, 1, 3, 3) and ids[0, 0].tolist() == [[t, t + 1, t + 2] for t in tokens]
    refused = stream_once(engine_server.grpc_url, "tensorrt_llm", token_inputs([5], 2, num_top_log_probs=(3, np.int32)))
    assert refused.finals == 1 and any("num_top_log_probs" in e and "UNSUPPORTED" in e for e in refused.errors)
