"""End to end with the embedded default (SmolLM2-135M-Instruct on transformers) behind a real tritonserver."""

from __future__ import annotations

import time

import numpy as np
import pytest
from greedy_reference import generate_with_logits, parting
from triton_client import StreamClient, stream_once, text_inputs, token_inputs

pytestmark = pytest.mark.e2e

SLOTS = 4  # the shared server's max_batch_size (conftest.smollm2_server)


@pytest.fixture(scope="module")
def server(smollm2_server):
    return smollm2_server


def _longest_gap_beside(url: str, prompt: list[int], context_logits: bool) -> float:
    """Seconds of the longest wait between a decoding stream's responses while `prompt` (asking for its context logits
    or not; only its output_ids come back) is prefilled beside it and answered."""
    client = StreamClient(url)
    try:
        running = client.send("tensorrt_llm", token_inputs([1, 504, 3575], 4000, min_tokens=(4000, np.int32)), "running")
        while len(running.responses) < 3:
            assert not running.done.wait(0.01), running.errors
        extra = {"return_context_logits": (True, np.bool_)} if context_logits else {}
        asked = client.send("tensorrt_llm", token_inputs(prompt, 1, **extra), "prompt", outputs=["output_ids"])
        arrivals, seen = [time.monotonic()], len(running.responses)
        deadline = time.monotonic() + 300
        while not asked.done.is_set():
            assert time.monotonic() < deadline and not running.done.is_set(), (asked.errors, running.errors)
            if len(running.responses) > seen:
                seen = len(running.responses)
                arrivals.append(time.monotonic())
            time.sleep(0.005)
        arrivals.append(time.monotonic())
        assert asked.errors == [] and len(asked.tokens()) == 1
    finally:
        client.cancel()
        client.close()
    return max(later - earlier for earlier, later in zip(arrivals, arrivals[1:]))


def test_a_prompt_asking_for_its_context_logits_is_prefilled_in_chunks(server):
    """A stream decodes beside a 1,000-token prompt: with return_context_logits its longest wait for a token is about
    what it is without (the logits come from the prefill's chunks). They came from one unchunked forward of the whole
    prompt on the engine thread: every stream stalled for it (5.29 s against 0.42 s for 1,365 tokens on 2 cores)."""
    plain = _longest_gap_beside(server.grpc_url, [1000 + (i * 7919) % 40000 for i in range(1000)], False)
    with_logits = _longest_gap_beside(server.grpc_url, [2000 + (i * 7907) % 40000 for i in range(1000)], True)
    assert with_logits < 2 * plain + 1.0, f"longest gap {with_logits:.2f} s with context logits, {plain:.2f} s without"


def test_chat_question_through_the_ensemble_names_paris(server):
    inputs = text_inputs("What is the capital of France?", 24, apply_chat_template=(True, np.bool_))
    result = stream_once(server.grpc_url, "ensemble", inputs, timeout_s=120)
    assert result.errors == [] and result.finals == 1
    assert "Paris" in result.text()


def test_streamed_text_concatenates_to_the_non_streamed_answer(server):
    prompt = "Écris une phrase sur le café ☕ et 東京."
    streamed = stream_once(server.grpc_url, "tensorrt_llm", text_inputs(prompt, 20), timeout_s=120)
    whole = stream_once(server.grpc_url, "tensorrt_llm", text_inputs(prompt, 20, stream=False), timeout_s=120)
    assert streamed.errors == [] and whole.errors == [] and len(whole.responses) == 1
    assert len(streamed.responses) > 1
    assert streamed.text() == whole.text()


def test_cancelled_streams_free_their_batch_slots(server):
    clients, results = [], []
    for i in range(SLOTS):
        client = StreamClient(server.grpc_url)
        clients.append(client)
        results.append(client.send("tensorrt_llm", token_inputs([1, 504, 3575 + i], 4000, min_tokens=(4000, np.int32)), f"long{i}"))
    deadline = time.monotonic() + 60
    while not all(r.responses for r in results):
        assert time.monotonic() < deadline, "long requests never started"
        time.sleep(0.05)
    for client in clients:
        client.cancel()
    started = time.monotonic()
    probe = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 504], 1), timeout_s=60)
    assert probe.errors == [] and len(probe.tokens()) == 1
    # With the slots still held the probe would wait for the 4000-token requests: many minutes on this CPU (about
    # 10 tokens/s per sequence). Freed, it takes one prefill and one step, a few seconds even on a busy machine.
    assert time.monotonic() - started < 60


def test_the_default_dtype_serves_greedy_answers_of_generate_in_that_dtype_up_to_near_ties(server):
    """With no `dtype` parameter the CPU serves bfloat16 where the CPU has bfloat16 dot products (this project's
    machines do), else float32. The served greedy answers are transformers' `generate` in that dtype, or part from it
    only where its two tokens' logits are within 0.5: rounding, not a different model."""
    from trtllm_model.embedded.model_loading import default_dtype, load_model
    from trtllm_model.pipeline.detokenizer import chat_prompt_ids

    loaded = load_model(dtype=default_dtype("cpu"))
    for question in ["What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?"]:
        prompt = chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": question}])
        served = stream_once(server.grpc_url, "tensorrt_llm", token_inputs(prompt, 24, min_tokens=(24, np.int32)),
                             timeout_s=120)
        assert served.errors == [] and served.finals == 1 and len(served.tokens()) == 24
        parted = parting(served.tokens(), *generate_with_logits(loaded.model, prompt, 24))
        assert parted is None or parted[1] <= 0.5, f"{question!r}: token {parted[0]} parts by a logit gap of {parted[1]}"
