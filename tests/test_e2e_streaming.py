"""End to end against a real tritonserver with the synthetic executor: streaming, non-streaming, HTTP, health."""

from __future__ import annotations

import json
import re
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from triton_client import StreamClient, stream_once, text_inputs, token_inputs

from trtllm_model.executors.synthetic import synthetic_token

pytestmark = pytest.mark.e2e


def expected(input_ids: list[int], count: int) -> list[int]:
    return [synthetic_token(input_ids, i, 32000) for i in range(count)]


def test_grpc_stream_gets_exact_tokens_in_order_with_one_final(synthetic_server):
    result = stream_once(synthetic_server.grpc_url, "tensorrt_llm", token_inputs([11, 12, 13], 16))
    assert result.errors == []
    assert result.tokens() == expected([11, 12, 13], 16)
    assert result.finals == 1
    # Streaming sends only new tokens: every response carries at least one, and sequence_length matches.
    for response in result.responses:
        assert response.as_numpy("sequence_length").reshape(-1)[0] == response.as_numpy("output_ids").size > 0


def test_tritonclient_stream_callback_sees_final_flag(synthetic_server):
    """The way users call it: tritonclient's stream API with enable_empty_final_response."""
    client = grpcclient.InferenceServerClient(synthetic_server.grpc_url)
    received, finished = [], threading.Event()

    def callback(result, error):
        assert error is None, error
        received.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            finished.set()

    client.start_stream(callback=callback)
    client.async_stream_infer("tensorrt_llm", token_inputs([100], 5), request_id="a", enable_empty_final_response=True)
    assert finished.wait(30)
    client.stop_stream()
    tokens = [int(t) for r in received if r.as_numpy("output_ids") is not None for t in r.as_numpy("output_ids").reshape(-1)]
    assert tokens == expected([100], 5)
    assert [r.get_response().parameters["triton_final_response"].bool_param for r in received].count(True) == 1


def test_without_empty_final_response_the_last_token_response_is_final(synthetic_server):
    client = grpcclient.InferenceServerClient(synthetic_server.grpc_url)
    received, lock = [], threading.Lock()
    client.start_stream(callback=lambda result, error: received.append((result, error)))
    client.async_stream_infer("tensorrt_llm", token_inputs([7], 4), request_id="b")
    client.stop_stream()  # waits for the stream to finish
    assert all(error is None for _, error in received)
    tokens = [int(t) for r, _ in received for t in r.as_numpy("output_ids").reshape(-1)]
    assert tokens == expected([7], 4)
    del lock


def test_end_id_stops_the_stream(synthetic_server):
    ids = [50]
    end_id = synthetic_token(ids, 3, 32000)
    result = stream_once(synthetic_server.grpc_url, "tensorrt_llm", token_inputs(ids, 20, end_id=(end_id, np.int32)))
    assert result.tokens() == expected(ids, 4)
    assert result.finals == 1


def test_non_streaming_sends_exactly_one_response_with_the_whole_output(synthetic_server):
    result = stream_once(synthetic_server.grpc_url, "tensorrt_llm", token_inputs([20, 21], 6, streaming=False))
    assert len(result.responses) == 1 and result.finals == 1
    assert result.tokens() == expected([20, 21], 6)  # the repository's config excludes the input


def test_non_streaming_includes_the_prompt_when_asked(synthetic_server):
    inputs = token_inputs([20, 21], 3, streaming=False, exclude_input_in_output=(False, np.bool_))
    result = stream_once(synthetic_server.grpc_url, "tensorrt_llm", inputs)
    assert result.tokens() == [20, 21] + expected([20, 21], 3)


def test_32_concurrent_streams_all_exact(synthetic_server):
    client = StreamClient(synthetic_server.grpc_url)
    try:
        prompts = {f"r{i}": [i * 7 + 1, i * 13 + 2] for i in range(32)}
        results = {rid: client.send("tensorrt_llm", token_inputs(ids, 24 + i % 5), rid) for i, (rid, ids) in enumerate(prompts.items())}
        for i, (rid, ids) in enumerate(prompts.items()):
            result = results[rid].wait(60)
            assert result.errors == []
            assert result.tokens() == expected(ids, 24 + i % 5), rid
            assert result.finals == 1
    finally:
        client.close()


def _post(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_http_generate_returns_one_response(synthetic_server):
    status, body = _post(f"{synthetic_server.http_url}/v2/models/tensorrt_llm/generate", {"input_ids": [1, 2, 3], "request_output_len": 4})
    assert status == 200, body
    assert json.loads(body)["output_ids"] == expected([1, 2, 3], 4)


def test_http_generate_stream_sends_one_data_line_per_response(synthetic_server):
    status, body = _post(
        f"{synthetic_server.http_url}/v2/models/tensorrt_llm/generate_stream",
        {"input_ids": [9, 8], "request_output_len": 5, "streaming": True},
    )
    assert status == 200, body
    events = [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]
    tokens = []
    for event in events:
        tokens += event["output_ids"] if isinstance(event["output_ids"], list) else [event["output_ids"]]
    assert tokens == expected([9, 8], 5)
    assert len(events) >= 1


def test_server_and_model_report_ready(synthetic_server):
    for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/tensorrt_llm/ready", "/v2/models/ensemble/ready"):
        with urllib.request.urlopen(synthetic_server.http_url + path, timeout=5) as response:
            assert response.status == 200, path
    client = grpcclient.InferenceServerClient(synthetic_server.grpc_url)
    assert client.is_server_ready() and client.is_model_ready("tensorrt_llm")


def test_ensemble_text_names_work_unchanged_with_optional_outputs(synthetic_server):
    """NVIDIA's text-level client: the synthetic tokenizer is byte-level, so "hi" continues as "jkl"."""
    inputs = text_inputs(
        "hi", 3,
        return_finish_reason=(True, np.bool_), return_num_input_tokens=(True, np.bool_),
        return_num_output_tokens=(True, np.bool_), return_log_probs=(True, np.bool_),
    )
    result = stream_once(synthetic_server.grpc_url, "ensemble", inputs)
    assert result.errors == [] and result.finals == 1
    assert result.text() == "jkl"
    last = result.responses[-1]
    assert last.as_numpy("finish_reason").reshape(-1)[0] == b"length"
    assert last.as_numpy("num_input_tokens").reshape(-1)[0] == 2
    assert last.as_numpy("num_output_tokens").reshape(-1)[0] == 3
    log_probs = [p for r in result.responses for p in r.as_numpy("output_log_probs").reshape(-1)]
    assert len(log_probs) == 3


def test_ensemble_generate_stream_over_http(synthetic_server):
    status, body = _post(
        f"{synthetic_server.http_url}/v2/models/ensemble/generate_stream",
        {"text_input": "ab", "max_tokens": 4, "stream": True},
    )
    assert status == 200, body
    events = [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]
    assert "".join(event["text_output"] for event in events) == "cdef"


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
def test_a_response_carries_only_the_outputs_its_request_asked_for(tmp_path, model):
    """tritonclient asks for text_output alone, on a request that also returns log probs and the finish reason. The
    model builds only the outputs Triton asks it for (the delivery timers count them; TRTLLM_DELIVERY_TIMING_S makes
    the model log them at shutdown): asked directly, one per response. Triton 2.51's ensemble asks its step for every
    output in its output_map whatever its own client asked for, so through `ensemble` all three are built (and the
    finish reason with the final): what the ensemble's client does not want is dropped by Triton, not here."""
    server = start_server(tmp_path, executor="synthetic", env={"TRTLLM_DELIVERY_TIMING_S": "3600"})
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        received, finished = [], threading.Event()

        def callback(result, error):
            received.append(error or result)
            if error or result.get_response().parameters["triton_final_response"].bool_param:
                finished.set()

        client.start_stream(callback=callback)
        inputs = text_inputs("hi", 8, return_log_probs=(True, np.bool_), return_finish_reason=(True, np.bool_))
        client.async_stream_infer(model, inputs, request_id="a", enable_empty_final_response=True,
                                  outputs=[grpcclient.InferRequestedOutput("text_output")])
        assert finished.wait(30)
        client.stop_stream()
        client.close()
        assert all(not isinstance(r, Exception) for r in received), received
        texts = [r.as_numpy("text_output") for r in received]
        assert "".join(t[0].decode() for t in texts if t is not None) == "jklmnopq"
        assert all(r.as_numpy("cum_log_probs") is None for r in received)  # Triton drops what was not asked for
    finally:
        server.stop()
    lines = re.findall(r"delivery timing over .*", server.log())
    assert lines, "no delivery timing line in the server log"
    found = re.search(r"([0-9.]+) outputs/response", lines[-1])
    assert found is not None, lines[-1]
    if model == "tensorrt_llm":
        assert float(found.group(1)) == 1.0, lines[-1]
    else:
        assert float(found.group(1)) > 3.0, lines[-1]
    # The one request came in one execute() call, timed too.
    assert re.search(r"execute: [0-9.]+ calls/s, 1\.0 requests a call, [0-9.]+ ms a call", lines[-1]), lines[-1]
