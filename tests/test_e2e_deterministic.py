"""One request's tokens and log probs are the same, bit for bit, whatever ran before it and whatever shares its batch,
against a real server: the embedded SmolLM2 on the CPU in float32 and in bfloat16, where the engine's `deterministic`
is the default (embedded/invariant_attention.py). Served as `trtllm-triton serve --decoupled false` serves NVIDIA's
unary clients.

The first test runs on the fresh server: NVIDIA's end_to_end_test.py --return-log-probs sends a prompt to
`tensorrt_llm` (ids from `preprocessing`) and then to `ensemble`, and asserts their log probs equal; the second
request finds the first one's blocks in the prefix cache, which used to move the last bits."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import start_server
from triton_client import as_inputs
from tritonclient.utils import np_to_triton_dtype

pytestmark = pytest.mark.e2e

# Long enough for three full KV blocks of 16 tokens (PROMPT, with its answer, for two key tiles of 64): a repeat
# finds them cached and computes only the rest.
NVIDIA_PROMPT = ("Born in north-east France, Soyer trained as a chef in Paris and moved to London in 1831, where he "
                 "cooked for the Reform Club. He wrote cookery books for the poor and ran soup kitchens in Dublin in 1847. "
                 "Tell me about his life:")
PROMPT = ("The history of cooking in Europe is long and varied: from the open hearths of the middle ages, where a "
          "whole household ate from one pot, to the kitchens of the great hotels and restaurants of Paris and London "
          "in the nineteenth century, where brigades of cooks worked under a chef, cooks")
SAME_PREFIX = PROMPT[: len(PROMPT) * 2 // 3] + " wrote books that are still read today. Name one of them."
OTHERS = ("hi", "Why is the sky blue? Answer in one short paragraph for a child.",
          "List the planets of the solar system in order from the sun, with one fact about each of them. " * 3)
MAX_TOKENS = 16
SAMPLED = {"temperature": np.array([[0.9]], dtype=np.float32), "runtime_top_k": np.array([[40]], dtype=np.int32),
           "runtime_top_p": np.array([[0.95]], dtype=np.float32), "seed": np.array([[1234]], dtype=np.uint64)}


def http_inputs(arrays: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
    out = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def request(prompt: str, max_tokens: int = MAX_TOKENS, **extra: np.ndarray) -> dict[str, np.ndarray]:
    return {"text_input": np.array([[prompt]], dtype=object), "max_tokens": np.array([[max_tokens]], dtype=np.int32),
            "return_log_probs": np.array([[True]], dtype=bool), "return_perf_metrics": np.array([[True]], dtype=bool),
            **extra}


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def server(tmp_path_factory, request):
    # Both dtypes the CPU default picks between (embedded/model_loading.default_dtype), each on a fresh server.
    server = start_server(tmp_path_factory.mktemp("deterministic"), executor="transformers",
                          parameters={"dtype": request.param}, models=("tensorrt_llm", "ensemble", "preprocessing"),
                          serve_args=["--decoupled", "false"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"), concurrency=8, network_timeout=300)
    yield client
    client.close()  # its kept-alive connections would hold the server's stop for the whole exit timeout (15 s)


def answer(result) -> tuple[list[bytes], list[float], float]:
    """(text, output log probs, cum log prob) of a response (a text request's tokens come back as text)."""
    return (result.as_numpy("text_output").reshape(-1).tolist(), result.as_numpy("output_log_probs").reshape(-1).tolist(),
            float(result.as_numpy("cum_log_probs").reshape(-1)[0]))


def test_nvidia_exact_log_prob_check_passes_on_a_fresh_server(server, client):
    # end_to_end_test.py -i http/grpc --return-log-probs: preprocessing, tensorrt_llm with return_log_probs, then
    # ensemble with the same prompt; `assert cum_log_probs == ensemble_cum_log_probs` and the output log probs all
    # equal. The ensemble's request is the prompt's second: a prefix-cache hit.
    pre = client.infer("preprocessing", http_inputs({
        "QUERY": np.array([[NVIDIA_PROMPT]], dtype=object),
        "REQUEST_OUTPUT_LEN": np.array([[MAX_TOKENS]], dtype=np.int32),
    }))
    assert pre.as_numpy("INPUT_ID").shape[1] > 48
    llm = client.infer("tensorrt_llm", http_inputs({
        "input_ids": pre.as_numpy("INPUT_ID"), "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
        "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"), "end_id": pre.as_numpy("OUT_END_ID"),
        "pad_id": pre.as_numpy("OUT_PAD_ID"), "return_log_probs": np.array([[True]], dtype=bool),
    }))
    arrays = {**request(NVIDIA_PROMPT), "bad_words": np.array([[""]], dtype=object),
              "stop_words": np.array([[""]], dtype=object)}
    http_ensemble = client.infer("ensemble", http_inputs(arrays))
    grpc_ensemble = grpcclient.InferenceServerClient(server.grpc_url).infer("ensemble", as_inputs(arrays))
    assert http_ensemble.as_numpy("kv_cache_reused_blocks").item() >= 3  # the prompt's blocks came from the cache
    cum, output = llm.as_numpy("cum_log_probs"), llm.as_numpy("output_log_probs")
    assert output.shape == (1, 1, MAX_TOKENS)
    for ensemble in (http_ensemble, grpc_ensemble):
        assert np.array_equal(cum, ensemble.as_numpy("cum_log_probs")), (cum, ensemble.as_numpy("cum_log_probs"))
        assert np.array_equal(output, ensemble.as_numpy("output_log_probs"))


@pytest.mark.parametrize("lead,sampling", [("", {}), ("Briefly. ", SAMPLED)], ids=["greedy", "sampled-with-seed"])
def test_a_request_is_bit_equal_after_a_prefix_hit_and_beside_other_requests(client, lead, sampling):
    prompt, same_prefix = lead + PROMPT, lead + SAME_PREFIX  # each case its own prompt: the first is computed whole
    alone = client.infer("tensorrt_llm", http_inputs(request(prompt, **sampling)))
    assert alone.as_numpy("kv_cache_reused_blocks").item() == 0
    reference = answer(alone)
    assert len(reference[1]) == MAX_TOKENS

    # After a request that shares its first blocks: they come from the cache, the rest is computed.
    client.infer("tensorrt_llm", http_inputs(request(same_prefix, 4)))
    again = client.infer("tensorrt_llm", http_inputs(request(prompt, **sampling)))
    assert again.as_numpy("kv_cache_reused_blocks").item() >= 1
    assert answer(again) == reference

    # Beside other requests, sent at once: they share its prefill and decode steps (their times overlap).
    futures = [client.async_infer("tensorrt_llm", http_inputs(request(other, 24))) for other in OTHERS[:2]]
    futures.insert(1, client.async_infer("tensorrt_llm", http_inputs(request(prompt, **sampling))))
    futures.append(client.async_infer("tensorrt_llm", http_inputs(request(OTHERS[2], 24))))
    results = [future.get_result() for future in futures]
    spans = [(r.as_numpy("first_scheduled_time_ns").item(), r.as_numpy("last_token_time_ns").item()) for r in results]
    mine = spans[1]
    assert any(start < mine[1] and mine[0] < end for start, end in spans[:1] + spans[2:]), spans
    assert answer(results[1]) == reference


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl, as NVIDIA's test.sh")
def test_nvidia_ci_wait_for_server_ready_passes_with_the_key_in_a_curlrc(server, tmp_path):
    # NVIDIA's test.sh waits for a server with `curl ... -d '{"log_verbose_level":1}' localhost:8000/v2/logging`,
    # no header; docs/nvidia_compatibility.md puts the admin key in $CURL_HOME/.curlrc, which curl reads first.
    command = ["curl", "-s", "--fail", "-o", "/dev/null", "-w", "%{http_code}", "-d", '{"log_verbose_level":1}',
               f"{server.http_url}/v2/logging"]
    environment = {name: value for name, value in os.environ.items() if name not in ("CURL_HOME", "XDG_CONFIG_HOME")}
    refused = subprocess.run(command, capture_output=True, text=True, env={**environment, "CURL_HOME": str(tmp_path)})
    assert refused.returncode != 0 and refused.stdout == "403"
    (tmp_path / ".curlrc").write_text(f'header = "trtllm-admin-key: {server.admin_key}"\n')
    accepted = subprocess.run(command, capture_output=True, text=True, env={**environment, "CURL_HOME": str(tmp_path)})
    assert accepted.returncode == 0 and accepted.stdout == "200", accepted
