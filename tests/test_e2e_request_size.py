"""Requests too large or too deep for tritonserver's HTTP parser, against a real server started by `serve`: each is
refused with a clear error before Triton reads it (trtllm_model/launch/http_guard.py), on every HTTP endpoint, the metrics
port and gRPC, and the server keeps serving. Without the guard the first 5 MB body sent as curl sends it
(application/x-www-form-urlencoded) ended tritonserver with SIGSEGV, and so did a 300 KB body of `[`."""

from __future__ import annotations

import gzip
import http.client
import json
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from triton_client import StreamClient, model_error, stream_once, tensor, text_inputs

from trtllm_model.launch.http_guard import MAX_BODY_BYTES, MAX_HEAD_BYTES, MAX_JSON_DEPTH

pytestmark = pytest.mark.e2e

MB = 1_000_000
SIZES_MB = (5, 20, 100)
FORM = "application/x-www-form-urlencoded"  # what `curl -d` and `curl --data-binary` send
ENDPOINTS = ("/v2/models/ensemble/generate", "/v2/models/tensorrt_llm/generate", "/v2/models/ensemble/infer",
             "/v2/models/ensemble/generate_stream", "/v2/models/no_such_model/generate", "/v2/health/ready")


def send(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         timeout_s: float = 120.0) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def assert_serving(server, started: float, what: str) -> None:
    """The server is up and answers a small generate at once (within a bound generous for busy CI cores)."""
    assert server.process.poll() is None, f"tritonserver ended after {what}:\n{server.log()[-3000:]}"
    status, reply = send(server.http_port, "POST", "/v2/models/ensemble/generate",
                         json.dumps({"text_input": "hello", "max_tokens": 2}).encode(), {"Content-Type": FORM})
    assert status == 200 and json.loads(reply)["text_output"], (what, status, reply)
    assert time.monotonic() - started < 60, f"a small request waited {time.monotonic() - started:.1f} s after {what}"


def test_bodies_of_5_20_and_100_mb_are_refused_413_on_every_http_endpoint_and_the_server_serves_on(synthetic_server):
    for size in SIZES_MB:
        # The reproduction: a prompt of `size` MB, posted as curl posts it.
        body = json.dumps({"text_input": "word " * (size * MB // 5), "max_tokens": 4}).encode()
        for path in ENDPOINTS:
            status, reply = send(synthetic_server.http_port, "POST", path, body, {"Content-Type": FORM})
            assert status == 413, (size, path, status, reply)
            assert json.loads(reply)["error"] == (f"request body of {len(body)} bytes is over this server's "
                                                  f"{MAX_BODY_BYTES} (HTTP); send larger requests over gRPC")
            assert_serving(synthetic_server, time.monotonic(), f"{size} MB to {path}")
        status, reply = send(synthetic_server.metrics_port, "POST", "/metrics", body, {"Content-Type": FORM})
        assert status == 413, (size, "metrics", status, reply)
        status, metrics = send(synthetic_server.metrics_port, "GET", "/metrics")
        assert status == 200 and "nv_inference_request_success" in metrics


def test_a_body_under_the_bound_reaches_the_model_which_names_its_own_limit(synthetic_server):
    """1.9 MB of form-encoded prompt (the shape that crashed Triton from 4.2 MB) passes the guard; the model refuses
    the prompt itself."""
    body = json.dumps({"text_input": "word " * 380_000, "max_tokens": 4}).encode()
    assert len(body) <= MAX_BODY_BYTES
    status, reply = send(synthetic_server.http_port, "POST", "/v2/models/ensemble/generate", body,
                         {"Content-Type": FORM})
    assert status == 400 and "text_input: 1900000 bytes" in reply, (status, reply)
    assert_serving(synthetic_server, time.monotonic(), "a 1.9 MB body")


DEEP_BODIES = {
    "300,000 [": b"[" * 300_000,
    "a field nesting 250,000 objects": b'{"text_input": ' + b'{"a": ' * 250_000 + b"1" + b"}" * 250_001,
}


@pytest.mark.parametrize("name", DEEP_BODIES)
def test_json_nested_too_deep_is_refused_400_on_every_endpoint(synthetic_server, name):
    body = DEEP_BODIES[name]
    for path in ENDPOINTS:
        status, reply = send(synthetic_server.http_port, "POST", path, body, {"Content-Type": "application/json"})
        assert status == 400, (path, status, reply)
        assert json.loads(reply)["error"] == f"the request's JSON nests deeper than {MAX_JSON_DEPTH} levels"
    assert_serving(synthetic_server, time.monotonic(), name)


def test_brackets_inside_strings_do_not_count_as_nesting(synthetic_server):
    text = "[" * 2000 + "{" * 2000  # the synthetic executor's tokens are bytes: within max_input_len=4096
    status, reply = send(synthetic_server.http_port, "POST", "/v2/models/ensemble/generate",
                         json.dumps({"text_input": text, "max_tokens": 2}).encode())
    assert status == 200 and json.loads(reply)["text_output"], (status, reply)


def test_huge_heads_and_chunked_bodies_are_refused_and_the_server_serves_on(synthetic_server):
    small = json.dumps({"text_input": "hi", "max_tokens": 2}).encode()
    cases = [
        ("a 5 MB header", "/v2/models/ensemble/generate", {"X-Big": "a" * 5 * MB}, small, 431),
        ("300,000 headers", "/v2/models/ensemble/generate", {f"X-{i}": "v" for i in range(300_000)}, small, 431),
        ("a 5 MB query string", "/v2/health/ready?" + "a=b&" * (5 * MB // 4), {}, b"", 431),
        ("a chunked body", "/v2/models/ensemble/generate", {"Transfer-Encoding": "chunked"}, b"5\r\nhello\r\n0\r\n\r\n",
         411),
        ("two Content-Length", "/v2/models/ensemble/generate", {"Content-Length": f"{len(small)}, {len(small)}"},
         small, 400),
        ("brotli", "/v2/models/ensemble/generate", {"Content-Encoding": "br"}, small, 415),
    ]
    for name, path, headers, body, expected in cases:
        status, reply = send(synthetic_server.http_port, "POST", path, body, headers)
        assert status == expected and json.loads(reply)["error"], (name, status, reply)
        assert_serving(synthetic_server, time.monotonic(), name)
    assert str(MAX_HEAD_BYTES) in send(synthetic_server.http_port, "GET", "/v2?" + "a" * MAX_HEAD_BYTES)[1]


def test_grpc_requests_of_5_20_and_100_mb_are_refused_by_the_model_and_the_server_serves_on(synthetic_server):
    """gRPC does not pass the guard: Triton reads it with gRPC's parser (2 GiB a message), and the model refuses an
    input over its bound, or Triton an input the model does not have."""
    client = StreamClient(synthetic_server.grpc_url)
    try:
        for size in SIZES_MB:
            prompt = "word " * (size * MB // 5)
            for model in ("ensemble", "tensorrt_llm"):
                started = time.monotonic()
                result = client.send(model, text_inputs(prompt, 4), f"{model}-{size}").wait(120)
                assert len(result.errors) == 1 and model_error(result.errors[0]).startswith(
                    f"INVALID_ARG: text_input: {size * MB} bytes cannot fit"), result.errors
                small = stream_once(synthetic_server.grpc_url, model, text_inputs("hello", 2), timeout_s=60)
                assert small.errors == [] and small.finals == 1, small.errors
                assert time.monotonic() - started < 60
            unknown = [*text_inputs("hello", 2), tensor("no_such_input", [prompt], np.object_)]
            result = client.send("tensorrt_llm", unknown, f"unknown-{size}").wait(120)
            assert len(result.errors) == 1 and "no_such_input" in result.errors[0], result.errors
            # A request parameter of `size` MB: Triton passes it on, and the model refuses a name it does not know.
            result = client.send("tensorrt_llm", text_inputs("hello", 2), f"parameter-{size}",
                                 parameters={"big": prompt}).wait(120)
            assert len(result.errors) == 1 and "unknown request parameter(s): big" in result.errors[0], result.errors
    finally:
        client.close()
    assert_serving(synthetic_server, time.monotonic(), "gRPC requests of 5 to 100 MB")


def test_compressed_bodies_are_bounded_decompressed_and_pass_when_within(unary_server):
    """Triton decompresses gzip and deflate bodies of a non-decoupled model's /infer before parsing them: 3 MB of
    `[` in 3 KB of gzip ended it as the plain one did. A compressed tritonclient request still passes."""
    infer = "/v2/models/tensorrt_llm/infer"
    cases = [
        ("3 MB of [", gzip.compress(b"[" * 3_000_000), 413, "decompresses to more than"),
        ("deep within the bound", gzip.compress(b"[" * 500_000 + b"]" * 500_000), 400, "nests deeper than"),
        ("not gzip", b"{}", 400, "not valid gzip data"),
    ]
    for name, body, expected, words in cases:
        status, reply = send(unary_server.http_port, "POST", infer, body, {"Content-Encoding": "gzip"})
        assert status == expected and words in json.loads(reply)["error"], (name, status, reply)
        assert unary_server.process.poll() is None, name
    client = httpclient.InferenceServerClient(f"127.0.0.1:{unary_server.http_port}")
    try:
        for algorithm in ("gzip", "deflate"):
            inputs = [httpclient.InferInput("text_input", [1, 1], "BYTES"),
                      httpclient.InferInput("max_tokens", [1, 1], "INT32")]
            inputs[0].set_data_from_numpy(np.array([["hello"]], dtype=np.object_))
            inputs[1].set_data_from_numpy(np.array([[3]], dtype=np.int32))
            result = client.infer("tensorrt_llm", inputs, request_compression_algorithm=algorithm)
            assert result.as_numpy("text_output") is not None, algorithm
    finally:
        client.close()
