"""Size bounds on what a client sends, against a real tritonserver serving the embedded SmolLM2 on CPU (as `make
serve` does): oversized prompts and word lists are refused before anything expensive runs, while the requests beside
them are answered; the logits of requests in flight share one budget."""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from triton_client import StreamClient, as_inputs, model_error, stream_once, tensor, text_inputs, token_inputs
from tritonclient.utils import InferenceServerException

from trtllm_model.pipeline.request_checks import MAX_WORDS

pytestmark = pytest.mark.e2e

VOCAB = 49152  # SmolLM2's
LOGITS_TOKENS = 24  # return_generation_logits of this many tokens: 24 x 49152 x 4 = 4.7 MB, 9.4 MB at their peak
# Room for one such request in flight at its peak, not two (two fitted when the budget counted one copy).
TOTAL_LOGITS_BYTES = 12_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("request_bounds"), executor="transformers",
                          parameters={"max_total_logits_bytes": str(TOTAL_LOGITS_BYTES)},
                          models=("tensorrt_llm", "preprocessing", "postprocessing"))
    yield server
    server.stop()


def _errors(result) -> list[str]:
    return [model_error(error) for error in result.errors]


def test_huge_prompt_and_word_list_are_refused_while_a_small_stream_is_answered(server):
    """A 10 MB text_input took the model's intake for 14.7 s (tokenized whole before its length was checked) and a
    4 MB bad_words list was accepted; both are refused from their size now, before the small stream beside them
    (already generating when they arrive) has finished its 96 tokens."""
    small_client, big_client = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        small = small_client.send("tensorrt_llm", token_inputs([1, 504, 3575], 96, min_tokens=(96, np.int32)), "small")
        while not small.responses and not small.done.is_set():
            small.done.wait(0.05)
        prompt = big_client.send("tensorrt_llm", text_inputs("hello world " * 870_000, 8), "prompt")  # 10.4 MB
        words = [f"word{i:05d}".encode() * 4 for i in range(100_000)]  # 100k words of 36 bytes: 3.6 MB
        listed = big_client.send("tensorrt_llm", token_inputs([1, 504], 8, bad_words=(words, np.object_)), "words")
        prompt.wait(120)
        listed.wait(120)
        small_done_after_refusals = not small.done.is_set()
        small.wait(300)
    finally:
        small_client.close()
        big_client.close()
    assert len(prompt.errors) == 1 and _errors(prompt)[0].startswith("INVALID_ARG: text_input: 10440000 bytes"), \
        prompt.errors
    assert "max_input_len=4096" in prompt.errors[0], prompt.errors
    assert len(listed.errors) == 1 and _errors(listed)[0].startswith(
        f"INVALID_ARG: bad_words: 100000 words; at most {MAX_WORDS}"), listed.errors
    assert small.errors == [] and small.finals == 1 and len(small.tokens()) == 96
    assert small_done_after_refusals, "the refusals came after the small stream had finished"
    after = stream_once(server.grpc_url, "tensorrt_llm", text_inputs("The capital of France is", 4), timeout_s=120)
    assert after.errors == [] and after.text()


def test_a_batch_of_long_prompts_is_refused_whole_before_any_is_tokenized(server):
    """64 prompts of 600 KB in one request (38.4 MB), each under the one-prompt bound (663,552 bytes): together they
    are over what one prompt may carry and the request is refused from their sizes, before the small stream beside it
    (already generating) has finished its 96 tokens. Tokenized row by row they took the model's intake for 16-20 s and
    left the stub 2.9 GiB larger."""
    rows, row_bytes = 64, 600_000
    small_client, big_client = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        small = small_client.send("tensorrt_llm", token_inputs([1, 504, 3575], 96, min_tokens=(96, np.int32)), "small")
        while not small.responses and not small.done.is_set():
            small.done.wait(0.05)
        prompts = np.array([[(b"hello world " * (row_bytes // 12))] for _ in range(rows)], np.object_)
        batch = big_client.send("tensorrt_llm", [tensor("text_input", prompts, np.object_),
                                                 tensor("max_tokens", np.full((rows, 1), 8), np.int32),
                                                 tensor("stream", np.full((rows, 1), True), np.bool_)], "batch")
        batch.wait(300)
        small_done_after_refusal = not small.done.is_set()
        small.wait(300)
    finally:
        small_client.close()
        big_client.close()
    assert len(batch.errors) == 1 and _errors(batch)[0].startswith(
        f"INVALID_ARG: text_input: {rows * row_bytes} bytes in {rows} prompts; a request's prompts together at most "
        "663552 bytes"), batch.errors
    assert small.errors == [] and small.finals == 1 and len(small.tokens()) == 96
    assert small_done_after_refusal, "the refusal came after the small stream had finished"


def test_logits_of_requests_in_flight_share_one_budget(server):
    """Two requests asking for 4.7 MB of logits each, 9.4 MB at their peak (the engine's copy and the response's),
    against max_total_logits_bytes=12000000: the second, sent while the first runs, is refused UNAVAILABLE (retry
    later); once the first has ended a third is answered."""
    first_client, second_client = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    logits = {"return_generation_logits": (True, np.bool_), "min_tokens": (LOGITS_TOKENS, np.int32)}
    try:
        first = first_client.send("tensorrt_llm", token_inputs([1, 504, 3575], LOGITS_TOKENS, **logits), "first")
        while not first.responses and not first.done.is_set():
            first.done.wait(0.05)
        second = second_client.send("tensorrt_llm", token_inputs([1, 504, 3576], LOGITS_TOKENS, **logits), "second")
        second.wait(120)
        first.wait(300)
    finally:
        first_client.close()
        second_client.close()
    assert first.errors == [] and len(first.tokens()) == LOGITS_TOKENS
    shapes = [r.as_numpy("generation_logits").shape for r in first.responses]
    assert sum(shape[-2] for shape in shapes) == LOGITS_TOKENS and {shape[-1] for shape in shapes} == {VOCAB}
    assert len(second.errors) == 1 and _errors(second)[0].startswith("UNAVAILABLE: queue full: logits budget"), \
        second.errors
    assert f"max_total_logits_bytes={TOTAL_LOGITS_BYTES}" in second.errors[0] and "retry" in second.errors[0]
    third = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 504, 3577], LOGITS_TOKENS, **logits),
                        timeout_s=300)
    assert third.errors == [] and len(third.tokens()) == LOGITS_TOKENS


def test_preprocessing_and_postprocessing_refuse_oversized_inputs_before_the_tokenizer_runs(server):
    """NVIDIA's three-model path: QUERY and BAD_WORDS_DICT are tokenized by `preprocessing`, TOKENS_BATCH decoded by
    `postprocessing`; each is bounded as tensorrt_llm's own inputs are (its max_input_len 4096, max_output_len 4096)."""
    def query(text: bytes, **extra) -> dict[str, np.ndarray]:
        return {"QUERY": np.array([[text]], np.object_), "REQUEST_OUTPUT_LEN": np.array([[8]], np.int32), **extra}

    cases = {
        "preprocessing": [
            (query(b"hello world " * 870_000), "QUERY: 10440000 bytes cannot fit max_input_len=4096"),
            (query(b"hi", BAD_WORDS_DICT=np.array([[b"w"] * 2000], np.object_)), "BAD_WORDS_DICT: 2000 words"),
        ],
        "postprocessing": [
            ({"TOKENS_BATCH": np.full((1, 1, 9000), 504, np.int32), "SEQUENCE_LENGTH": np.array([[9000]], np.int32)},
             "SEQUENCE_LENGTH: 9000 tokens; at most 8192"),
        ],
    }
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for model, refused in cases.items():
            for tensors, message in refused:
                with pytest.raises(InferenceServerException) as raised:
                    client.infer(model, as_inputs(tensors))
                assert raised.value.message().startswith(f"INVALID_ARG: {message}"), raised.value.message()
        answered = client.infer("preprocessing", as_inputs(query(b"The capital of France is")))
    assert answered.as_numpy("REQUEST_INPUT_LEN")[0, 0] > 0


def test_a_batchs_prompts_are_tokenized_together_and_a_bad_one_fails_alone(tmp_path):
    """Triton hands execute() these requests in one batch (a queue delay holds them until all have come); their text
    prompts are tokenized in one call (conventions/parsing.py). Each good one is answered with its own prompt's token
    count; an empty prompt, one over max_input_len once tokenized, and one that is not UTF-8 each get their own
    INVALID_ARG."""
    from trtllm_model.embedded.model_loading import load_tokenizer
    from trtllm_model.pipeline.detokenizer import chat_prompt_ids

    server = start_server(tmp_path, executor="transformers", models=("tensorrt_llm",),
                          config_edits={"max_queue_delay_microseconds: 0": "max_queue_delay_microseconds: 2000000"},
                          env={"TRTLLM_DELIVERY_TIMING_S": "3600"})
    asks = (True, np.bool_)
    requests = {
        "chat": text_inputs("What is the capital of France?", 2, apply_chat_template=asks, return_num_input_tokens=asks),
        "plain": text_inputs("The capital of France is", 2, return_num_input_tokens=asks),
        "empty": text_inputs("", 2),
        "long": text_inputs("hello " * 5000, 2),  # 5,001 tokens: within the byte bound, over max_input_len=4096
        "bytes": [*text_inputs("x", 2)[1:], grpcclient.InferInput("text_input", [1, 1], "BYTES")],
    }
    requests["bytes"][-1].set_data_from_numpy(np.array([[b"\xff\xfe not UTF-8"]], np.object_))
    # One stream, connected before the first send: its requests reach Triton's queue within milliseconds of each
    # other however slow the machine (five streams connecting on a loaded CI machine once missed the queue delay).
    client = StreamClient(server.grpc_url)
    try:
        grpc.channel_ready_future(client.channel).result(timeout=60)
        results = {name: client.send("tensorrt_llm", inputs, name) for name, inputs in requests.items()}
        for result in results.values():
            result.wait(300)
    finally:
        client.close()
        server.stop()
    tokenizer = load_tokenizer()
    expected = {"chat": len(chat_prompt_ids(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])),
                "plain": len(tokenizer.encode("The capital of France is"))}
    for name, count in expected.items():
        result = results[name]
        assert result.errors == [] and result.finals == 1, (name, result.errors)
        assert result.responses[-1].as_numpy("num_input_tokens").reshape(-1)[0] == count, name
    assert _errors(results["empty"]) == ["INVALID_ARG: text_input: the prompt is empty"]
    long_tokens = len(tokenizer.encode("hello " * 5000))
    assert _errors(results["long"]) == [f"INVALID_ARG: input_ids: prompt of {long_tokens} tokens is over max_input_len=4096"]
    assert len(results["bytes"].errors) == 1 and _errors(results["bytes"])[0].startswith(
        "INVALID_ARG: text_input: not valid UTF-8"), results["bytes"].errors
    timing = re.findall(r"execute: [0-9.]+ calls/s, ([0-9.]+) requests a call", server.log())
    assert timing and float(timing[-1]) > 1.0, timing  # they came together: the batch path is what ran
