"""The requests NVIDIA's client scripts send (tensorrtllm_backend `inflight_batcher_llm/client/`, early 2025), with
their tensors' names, dtypes, shapes and defaults, read back the way those scripts read them, against a real
server: the embedded SmolLM2 where the text matters, the synthetic executor where exact tokens and timing do.

Our own code; no line of NVIDIA's scripts. What the scripts send:
- `end_to_end_grpc_client.py` -> `ensemble`: text_input [[prompt]] BYTES, max_tokens [[n]] INT32, stream [[b]] BOOL,
  beam_width [[1]] INT32, temperature [[1.0]] FP32, exclude_input_in_output [[False]] BOOL (always sent), and on
  request stop_words / bad_words [[w, ...]] BYTES, return_log_probs [[True]] BOOL; one gRPC stream per request
  (start_stream, async_stream_infer, stop_stream), output `text_output[0].decode()`.
- `inflight_batcher_llm_client.py` -> `tensorrt_llm`: input_ids [[ids]] INT32, input_lengths [[len]],
  request_output_len [[n]], beam_width [[1]], temperature [[1.0]], streaming [[b]], end_id [[eos]], pad_id [[pad]],
  runtime_top_k [[1]], runtime_top_p [[0.0]] (their defaults), optionally return_log_probs, exclude_input_in_output;
  streaming over a gRPC stream, otherwise unary `async_infer` with parameters {"Streaming": b}; stop after a delay
  with a second request of the same id carrying stop [[True]] (input_ids np.empty [1, 1], input_lengths [[0]],
  request_output_len [[0]]), or by cancelling.
"""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_client import as_inputs

pytestmark = pytest.mark.e2e

PROMPT = "Born in north-east France, Soyer trained as a"


def ensemble_request(prompt: str, max_tokens: int, stream: bool, **extra) -> list[grpcclient.InferInput]:
    """end_to_end_grpc_client.py's tensors."""
    arrays = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones_like([[prompt]]).astype(np.int32) * max_tokens,
        "stream": np.array([[stream]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[extra.pop("exclude_input_in_output", False)]], dtype=bool),
    }
    for name in ("stop_words", "bad_words"):
        if name in extra:
            arrays[name] = np.array([extra.pop(name)], dtype=object)
    if extra.pop("return_log_probs", False):
        arrays["return_log_probs"] = np.array([[True]], dtype=bool)
    assert not extra, extra
    return as_inputs(arrays)


def token_request(ids: list[int], max_tokens: int, streaming: bool, end_id: int, pad_id: int,
                  **extra) -> list[grpcclient.InferInput]:
    """inflight_batcher_llm_client.py's tensors, with its defaults (top_k 1, top_p 0.0, temperature 1.0)."""
    arrays = {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "streaming": np.array([[streaming]], dtype=bool),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "pad_id": np.array([[pad_id]], dtype=np.int32),
        "runtime_top_k": np.array([[1]], dtype=np.int32),
        "runtime_top_p": np.array([[0.0]], dtype=np.float32),
    }
    if extra.pop("return_log_probs", False):
        arrays["return_log_probs"] = np.array([[True]], dtype=bool)
    exclude = extra.pop("exclude_input_in_output", None)  # the script sends it only with --exclude-input-in-output
    if exclude is not None:
        arrays["exclude_input_in_output"] = np.array([[exclude]], dtype=bool)
    assert not extra, extra
    return as_inputs(arrays)


def stop_request() -> list[grpcclient.InferInput]:
    return as_inputs({
        "input_ids": np.empty([1, 1], dtype=np.int32),
        "input_lengths": np.zeros([1, 1], dtype=np.int32),
        "request_output_len": np.array([[0]], dtype=np.int32),
        "stop": np.array([[True]], dtype="bool"),
    })


class Stream:
    """A gRPC stream the way the scripts use one: a callback collecting results and errors in a queue."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.seen: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.seen.put(error or result))

    def send(self, model: str, inputs, request_id: str = "", **kwargs) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id, **kwargs)

    def close(self, cancel_requests: bool = False) -> list:
        self.client.stop_stream(cancel_requests=cancel_requests)  # returns once the server ended every request
        self.client.close()
        return [self.seen.get() for _ in range(self.seen.qsize())]


def ensemble_text(results: list) -> str:
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    return "".join(r.as_numpy("text_output")[0].decode("utf-8") for r in results)


@pytest.fixture(scope="module")
def smol(smollm2_server):
    return smollm2_server


@pytest.fixture(scope="module")
def tokenizer():
    from trtllm_model.embedded.model_loading import load_tokenizer

    return load_tokenizer()


def test_ensemble_streaming_and_not_give_the_same_text(smol):
    streamed = Stream(smol.grpc_url)
    streamed.send("ensemble", ensemble_request(PROMPT, 12, stream=True))
    parts = streamed.close()
    whole = Stream(smol.grpc_url)
    whole.send("ensemble", ensemble_request(PROMPT, 12, stream=False))
    [result] = whole.close()
    text = result.as_numpy("text_output")[0].decode("utf-8")
    # Not streaming, with exclude_input_in_output false: the prompt, then the generated text (NVIDIA's postprocessing
    # decodes the whole sequence); streaming: only new text, in several responses.
    assert len(parts) > 2 and text == PROMPT + ensemble_text(parts)
    assert len(ensemble_text(parts).split()) >= 6


def test_ensemble_stop_words_end_the_text(smol):
    free = Stream(smol.grpc_url)
    free.send("ensemble", ensemble_request(PROMPT, 16, stream=True))
    unconstrained = ensemble_text(free.close())
    stop_word = " " + unconstrained.split()[3]  # a word in the middle of the greedy answer
    stopped = Stream(smol.grpc_url)
    stopped.send("ensemble", ensemble_request(PROMPT, 16, stream=True, stop_words=[stop_word, " nowhere-to-be-seen"]))
    text = ensemble_text(stopped.close())
    assert text.endswith(stop_word) and unconstrained.startswith(text) and len(text) < len(unconstrained)


def test_ensemble_log_probs_as_nvidia_shapes_them(smol):
    stream = Stream(smol.grpc_url)
    stream.send("ensemble", ensemble_request(PROMPT, 6, stream=False, return_log_probs=True))
    [result] = stream.close()
    log_probs, cum = result.as_numpy("output_log_probs"), result.as_numpy("cum_log_probs")
    assert log_probs.shape == (1, 1, 6) and cum.shape == (1, 1)
    assert (log_probs <= 0).all() and cum[0, 0] == pytest.approx(log_probs.sum(), rel=1e-4)


def test_exclude_input_in_output(smol, tokenizer):
    ids = tokenizer.encode(PROMPT)
    eos = tokenizer.eos_token_id
    outputs = {}
    for exclude in (False, True):
        stream = Stream(smol.grpc_url)
        stream.send("tensorrt_llm", token_request(ids, 5, False, eos, eos, exclude_input_in_output=exclude))
        [result] = stream.close()
        outputs[exclude] = result.as_numpy("output_ids")[0][0].tolist()
        assert result.as_numpy("sequence_length")[0][0] == len(outputs[exclude])
    assert outputs[False] == ids + outputs[True] and len(outputs[True]) == 5


def test_token_streaming_with_the_scripts_defaults_is_greedy(smol, tokenizer):
    ids, eos = tokenizer.encode(PROMPT), tokenizer.eos_token_id
    runs = []
    for _ in range(2):
        stream = Stream(smol.grpc_url)
        stream.send("tensorrt_llm", token_request(ids, 8, True, eos, eos, return_log_probs=True))
        results = stream.close()
        assert not any(isinstance(r, Exception) for r in results), results
        runs.append([t for r in results for t in r.as_numpy("output_ids")[0][0].tolist()])
        for r in results:
            assert r.as_numpy("output_log_probs").shape[:2] == (1, 1) and r.as_numpy("cum_log_probs").shape == (1, 1)
    # runtime_top_k=1, runtime_top_p=0.0, temperature=1.0 is greedy in NVIDIA's backend: the same tokens each time.
    assert runs[0] == runs[1] and len(runs[0]) == 8
    assert tokenizer.decode(runs[0]).strip().startswith("cart")


def test_stop_after_ms_with_the_stop_input_ends_the_stream_normally(smol, tokenizer):
    ids, eos = tokenizer.encode(PROMPT), tokenizer.eos_token_id
    stream = Stream(smol.grpc_url)
    stream.send("tensorrt_llm", token_request(ids, 400, True, eos, eos), request_id="42")
    time.sleep(1.5)
    stream.send("tensorrt_llm", stop_request(), request_id="42", parameters={"Streaming": True})
    results = stream.close()
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors == [], errors  # the script raises on any error that is not a gRPC CANCELLED status
    tokens = [t for r in results if r.get_output("output_ids") is not None for t in r.as_numpy("output_ids")[0][0]]
    assert 0 < len(tokens) < 400
    assert any(r.get_output("output_ids") is None for r in results)  # the stop request's own empty answer


def test_request_cancel_frees_the_server(smol, tokenizer):
    ids, eos = tokenizer.encode(PROMPT), tokenizer.eos_token_id
    stream = Stream(smol.grpc_url)
    stream.send("tensorrt_llm", token_request(ids, 400, True, eos, eos), request_id="43")
    time.sleep(1.0)
    started = time.monotonic()
    got = stream.close(cancel_requests=True)
    assert time.monotonic() - started < 5
    assert 0 < len(got) < 400
    # The cancelled request no longer occupies the engine: a new one is answered right away.
    after = Stream(smol.grpc_url)
    after.send("tensorrt_llm", token_request(ids, 3, True, eos, eos))
    assert sum(r.as_numpy("output_ids").size for r in after.close()) == 3


# -- non-streaming against the non-decoupled model (synthetic executor: exact tokens) ----------------------------
def test_unary_async_infer_as_the_script_sends_it(unary_server):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.async_infer("tensorrt_llm", token_request([5, 6, 7], 4, False, 0, 0, return_log_probs=True),
                       lambda result, error: answers.put(error or result), request_id="",
                       parameters={"Streaming": False})
    result = answers.get(timeout=30)
    assert not isinstance(result, Exception), result
    # Our repository sets exclude_input_in_output (as NVIDIA's quick start does): the new tokens only.
    assert result.as_numpy("output_ids").tolist() == [[[8, 9, 10, 11]]]
    assert result.as_numpy("sequence_length")[0][0] == 4
    assert result.as_numpy("output_log_probs")[0].shape == (1, 4) and result.as_numpy("cum_log_probs")[0].shape == (1,)


def test_unary_stop_after_ms_with_the_stop_input(unary_server):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.async_infer("tensorrt_llm", token_request([1], 4000, False, 0, 0), lambda result, error: answers.put(
        error or result), request_id="44", parameters={"Streaming": False})
    time.sleep(0.3)
    client.async_infer("tensorrt_llm", stop_request(), lambda result, error: answers.put(error or result),
                       request_id="44", parameters={"Streaming": False})
    first, second = answers.get(timeout=30), answers.get(timeout=30)
    assert not isinstance(first, Exception) and not isinstance(second, Exception), (first, second)
    stopped = next(r for r in (first, second) if r.get_output("output_ids") is not None)
    assert next(r for r in (first, second) if r is not stopped).get_output("output_ids") is None
    assert 0 < stopped.as_numpy("output_ids")[0][0].size < 4000


def test_unary_request_cancel(unary_server):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    answers: queue.Queue = queue.Queue()
    future = client.async_infer("tensorrt_llm", token_request([1], 4000, False, 0, 0),
                                lambda result, error: answers.put(error or result), request_id="45")
    time.sleep(0.3)
    future.cancel()
    answer = answers.get(timeout=30)
    assert isinstance(answer, grpcclient.InferenceServerException) and answer.status() == "StatusCode.CANCELLED"
    again = client.infer("tensorrt_llm", token_request([1], 3, False, 0, 0))
    assert again.as_numpy("output_ids").tolist() == [[[2, 3, 4]]]
