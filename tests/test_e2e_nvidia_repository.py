"""NVIDIA's five-model repository against a real server: what NVIDIA's end_to_end_test.py sends to preprocessing,
tensorrt_llm (with decoder_input_ids), postprocessing, ensemble and tensorrt_llm_bls; its metric checks read right
after the responses; test_max_queue_size.py's burst. Served as `make serve DECOUPLED=false` serves (unary clients),
with the embedded SmolLM2 (greedy: the three paths must give the same text)."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import start_server
from prometheus_text import parse
from triton_client import as_inputs
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

pytestmark = pytest.mark.e2e

MODELS = ("tensorrt_llm", "ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls")
PROMPT = "The capital of France is Answer briefly."
LABELS = {"model": "tensorrt_llm", "version": "1"}
QUEUE = 2  # max_queue_size; with max_batch_size 1 the model holds 3 requests at most


def inputs(arrays: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
    out = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def text_request(prompt: str, max_tokens: int) -> list[httpclient.InferInput]:
    # As end_to_end_test.py: [[prompt]], max_tokens, and empty bad/stop word lists.
    return inputs({
        "text_input": np.array([[prompt]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "bad_words": np.array([[""]], dtype=object),
        "stop_words": np.array([[""]], dtype=object),
    })


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # A 30 s stats period: the per-request metrics must not wait for it.
    server = start_server(
        tmp_path_factory.mktemp("nvidia-repository"), executor="transformers", models=MODELS,
        parameters={"stats_check_period_ms": "30000", "max_queue_size": str(QUEUE), "max_batch_size": "1"},
        serve_args=["--decoupled", "false"],
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"), concurrency=16, network_timeout=300)
    yield client
    client.close()  # its kept-alive connections would hold the server's stop for the whole exit timeout (15 s)


def three_models(client, prompt: str, max_tokens: int) -> np.ndarray:
    return three_models_with_log_probs(client, prompt, max_tokens, log_probs=False)[0]


def three_models_with_log_probs(client, prompt: str, max_tokens: int, log_probs: bool = True):
    """end_to_end_test.py's manual path: (postprocessing's OUTPUT, tensorrt_llm's result), `return_log_probs`
    on the tensorrt_llm call when log_probs, as the script sends it with --return-log-probs."""
    pre = client.infer("preprocessing", inputs({
        "QUERY": np.array([[prompt]], dtype=object),
        "BAD_WORDS_DICT": np.array([[""]], dtype=object),
        "STOP_WORDS_DICT": np.array([[""]], dtype=object),
        "REQUEST_OUTPUT_LEN": np.array([[max_tokens]], dtype=np.int32),
    }))
    assert pre.as_numpy("INPUT_ID").dtype == np.int32 and pre.as_numpy("INPUT_ID").shape[0] == 1
    assert pre.as_numpy("REQUEST_INPUT_LEN").tolist() == [[pre.as_numpy("INPUT_ID").shape[1]]]
    assert pre.as_numpy("BAD_WORDS_IDS").shape == (1, 2, 1)  # [""]: no word, NVIDIA's padded shape
    decoder_ids = pre.as_numpy("DECODER_INPUT_ID")
    assert decoder_ids.tolist() == pre.as_numpy("OUT_PAD_ID").tolist()  # [[pad_id]]
    llm = client.infer("tensorrt_llm", inputs({
        "input_ids": pre.as_numpy("INPUT_ID"),
        "decoder_input_ids": decoder_ids,  # refused as UNSUPPORTED before issue 23; ignored now
        "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
        "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
        "end_id": pre.as_numpy("OUT_END_ID"),
        "pad_id": pre.as_numpy("OUT_PAD_ID"),
        **({"return_log_probs": np.array([[True]], dtype=bool)} if log_probs else {}),
    }))
    post = client.infer("postprocessing", inputs({
        "TOKENS_BATCH": llm.as_numpy("output_ids").astype(np.int32),
        "SEQUENCE_LENGTH": llm.as_numpy("sequence_length"),
    }))
    return post.as_numpy("OUTPUT"), llm


def test_the_three_models_the_ensemble_and_the_bls_give_the_same_text(client):
    manual = three_models(client, PROMPT, 12)
    ensemble = client.infer("ensemble", text_request(PROMPT, 12), outputs=[httpclient.InferRequestedOutput("text_output")])
    bls = client.infer("tensorrt_llm_bls", text_request(PROMPT, 12), outputs=[httpclient.InferRequestedOutput("text_output")])
    assert manual.shape == (1, 1) and manual[0][0]  # [batch, beams], not empty
    assert manual == ensemble.as_numpy("text_output")  # end_to_end_test.py's own comparison
    assert manual == bls.as_numpy("text_output")


def test_preprocessing_word_lists_end_ids_and_refusals(client):
    pre = client.infer("preprocessing", inputs({
        "QUERY": np.array([["Hello"], ["Hello there, friend"]], dtype=object),
        "REQUEST_OUTPUT_LEN": np.array([[4], [4]], dtype=np.int32),
        "STOP_WORDS_DICT": np.array([["Paris", "."], ["", "London"]], dtype=object),
        "END_ID": np.array([[7], [7]], dtype=np.int32),
    }))
    lengths = pre.as_numpy("REQUEST_INPUT_LEN")[:, 0]
    ids = pre.as_numpy("INPUT_ID")
    assert ids.shape == (2, max(lengths)) and lengths[0] < lengths[1]
    assert (ids[0, lengths[0]:] == pre.as_numpy("OUT_PAD_ID")[0, 0]).all()  # padded with pad_id
    assert pre.as_numpy("OUT_END_ID").tolist() == [[7], [7]]
    stop = pre.as_numpy("STOP_WORDS_IDS")
    assert stop.shape[:2] == (2, 2)
    assert stop[1, 1].tolist().count(-1) == stop.shape[2] - 1  # one word ("" is skipped), offsets padded with -1
    with pytest.raises(InferenceServerException, match="UNSUPPORTED: IMAGE_URL"):
        client.infer("preprocessing", inputs({
            "QUERY": np.array([["x"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[4]], dtype=np.int32),
            "IMAGE_URL": np.array([["http://127.0.0.1/x.png"]], dtype=object),
        }))
    with pytest.raises(InferenceServerException, match="INVALID_ARG: SEQUENCE_LENGTH"):
        client.infer("postprocessing", inputs({
            "TOKENS_BATCH": np.array([[[1, 2]]], dtype=np.int32), "SEQUENCE_LENGTH": np.array([[3]], dtype=np.int32),
        }))


def scrape(server) -> object:
    return parse(requests.get(server.metrics_url, timeout=10).text)


def test_metrics_are_in_nvidias_units_right_after_the_response(server, client):
    before = scrape(server).value("nv_llm_output_token_len_count", response_metric_type="total_output_tokens", **LABELS)
    client.infer("ensemble", text_request(PROMPT, 5))
    received = time.monotonic()
    while True:  # the histograms are in before the response leaves; the gauges follow on the metrics thread
        metrics = scrape(server)
        count = metrics.value("nv_llm_output_token_len_count", response_metric_type="total_output_tokens", **LABELS)
        stamps = metrics.find("nv_trt_llm_general_metrics", general_type="timestamp", **LABELS)
        if (count > before and stamps) or time.monotonic() - received > 5:
            break
        time.sleep(0.005)
    lag = time.monotonic() - received
    assert count == before + 1
    assert lag < 1.0, f"histogram and gauges recorded {lag:.3f} s after the response (stats period 30 s)"
    stamp = metrics.value("nv_trt_llm_general_metrics", general_type="timestamp", **LABELS)
    assert stamp == int(stamp) and abs(stamp / 1e6 - time.time()) < 120  # integer microseconds
    assert metrics.value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="reused", **LABELS) == 0


def test_a_scrape_right_after_each_final_response_finds_its_request(server, client):
    # NVIDIA's checks scrape once, right after the responses. Before the metrics were recorded ahead of the final
    # response, such a scrape missed the request about a quarter of the time (bench/nvidia_repository.py
    # --metrics-gap); 0.75 ** 20 < 0.5 %.
    ids = np.array([[72, 101, 108, 108, 111]], dtype=np.int32)
    token_request = {"input_ids": ids, "input_lengths": np.array([[5]], dtype=np.int32),
                     "request_output_len": np.array([[2]], dtype=np.int32)}

    def counts() -> tuple[float, float]:
        metrics = scrape(server)
        return (metrics.value("nv_llm_output_token_len_count", response_metric_type="total_output_tokens", **LABELS),
                sum(metrics.find("nv_llm_requests_finished_total", **LABELS).values()))

    missed = []
    for i in range(20):
        before = counts()
        if i % 2:
            client.infer("ensemble", text_request(PROMPT, 2))
        else:
            client.infer("tensorrt_llm", inputs(token_request))
        after = counts()
        if after != (before[0] + 1, before[1] + 1):
            missed.append((i, before, after))
    assert missed == []


def test_a_burst_past_the_queue_is_unavailable_with_tritons_wording(client):
    # test_max_queue_size.py: many async requests at once; some must come back with the queue-size message.
    ids = np.array([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=np.int32)
    burst = [client.async_infer("tensorrt_llm", inputs({
        "input_ids": ids, "input_lengths": np.array([[8]], dtype=np.int32),
        "request_output_len": np.array([[24]], dtype=np.int32),
        "end_id": np.array([[-1]], dtype=np.int32), "pad_id": np.array([[2]], dtype=np.int32),
    }), request_id="1") for _ in range(12)]
    refused, served = [], 0
    for future in burst:
        try:
            future.get_result()
            served += 1
        except InferenceServerException as exc:
            refused.append(str(exc))
    assert served >= 1 and refused
    for message in refused:
        assert "UNAVAILABLE" in message and "Exceeds maximum queue size" in message, message
        # The executor's queue (max_queue_size 2) or the model's bound (max_batch_size 1 + max_queue_size 2).
        assert re.search(r"Maximum queue size of [23] reached", message), message


def test_tensorrt_llm_ensemble_and_bls_give_bit_equal_log_probs(server, client):
    # end_to_end_test.py --test-bls --return-log-probs (-i http and -i grpc), per prompt and one at a time: the three
    # models with return_log_probs on the tensorrt_llm call, then ensemble, then tensorrt_llm_bls. Its exact check is
    # tensorrt_llm's log probs == ensemble's (`assert cum_log_probs == ensemble_cum_log_probs`, `(output_log_probs
    # == ensemble_output_log_probs).all()`); its BLS log-prob asserts are commented out ("flaky"), here they hold
    # too. The tensorrt_llm/ensemble check failed 4 of 4 times over gRPC before issue 34: torch's CPU attention
    # summed in an order set by the intra-op thread count, which follows the host's load.
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    for prompt in ("Born in north-east France, Soyer trained as a", PROMPT * 3):
        text, llm = three_models_with_log_probs(client, prompt, 8)
        answers = [("http tensorrt_llm (three models)", text, llm.as_numpy("cum_log_probs"),
                    llm.as_numpy("output_log_probs"))]
        for protocol, model in (("http", "ensemble"), ("http", "tensorrt_llm_bls"), ("grpc", "ensemble"),
                                ("grpc", "tensorrt_llm_bls")):
            arrays = {"text_input": np.array([[prompt]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32),
                      "bad_words": np.array([[""]], dtype=object), "stop_words": np.array([[""]], dtype=object),
                      "return_log_probs": np.array([[True]], dtype=bool)}
            result = (client.infer(model, inputs(arrays)) if protocol == "http"
                      else grpc_client.infer(model, as_inputs(arrays)))
            answers.append((f"{protocol} {model}", result.as_numpy("text_output"), result.as_numpy("cum_log_probs"),
                            result.as_numpy("output_log_probs")))
        first = answers[0]
        assert first[2].shape == (1, 1) and first[3].shape == (1, 1, 8)
        for other in answers[1:]:
            assert (first[1] == other[1]).all(), (first[0], other[0], first[1], other[1])  # [[text]] == [text]
            assert np.array_equal(first[2], other[2]), (first[0], other[0], first[2].tolist(), other[2].tolist())
            assert np.array_equal(first[3], other[3]), (first[0], other[0], first[3].tolist(), other[3].tolist())
