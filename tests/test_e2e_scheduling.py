"""Admission by what a request needs now (issue 33), where a user meets it: the CPU deployment's defaults (the
embedded SmolLM2, max_batch_size 32, a 1 GiB KV pool of 1,456 blocks) behind the OpenAI frontend, whose chats
without max_tokens get max_output_len = 4096. Reserving prompt + 4096 tokens per request let 5 chats run at once
(e488561); each needs a few blocks now, so all 32 do. Timings of the same scenario: bench/scheduling.py."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import start_server
from openai import AsyncOpenAI, OpenAI
from prometheus_text import scrape
from triton_client import StreamClient, stream_once, token_inputs

pytestmark = pytest.mark.e2e

CHATS = 32  # the repository's max_batch_size
TOPICS = ["a lighthouse", "tea", "a robot", "aqueducts", "Mars", "bees", "a dragon", "printing"]


@pytest.fixture(scope="module")
def served(smollm2_openai_server):
    return smollm2_openai_server


async def _chats_running_at_once(base_url: str, metrics_url: str) -> tuple[list[float | None], list[str], float]:
    """Send CHATS chats at once, max_tokens unset; hold every stream open until all have a first token (or 120 s),
    then read the engine's active-requests gauge. (first-token times, finish reasons seen meanwhile, gauge)."""
    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    firsts: list[float | None] = [None] * CHATS
    finishes: list[str] = []
    all_started, release = asyncio.Event(), asyncio.Event()

    async def chat(index: int) -> None:
        stream = await client.chat.completions.create(
            model="tensorrt_llm", stream=True,
            messages=[{"role": "user", "content": f"Tell me a long story about {TOPICS[index % len(TOPICS)]} "
                                                  f"number {index}."}],
            extra_body={"ignore_eos": True},  # no early end: the default max_tokens is what it may generate
        )
        try:
            async for chunk in stream:
                choice = chunk.choices[0]
                if choice.finish_reason is not None:
                    finishes.append(choice.finish_reason)
                    return
                if choice.delta.content and firsts[index] is None:
                    firsts[index] = time.monotonic()
                    if all(firsts):
                        all_started.set()
                if release.is_set():
                    return
        finally:
            await stream.close()  # closing the connection cancels the request

    tasks = [asyncio.create_task(chat(i)) for i in range(CHATS)]
    gauge = 0.0
    try:
        await asyncio.wait_for(all_started.wait(), 120)
        deadline = time.monotonic() + 10  # the gauge is updated from the engine's stats every 100 ms
        while gauge < CHATS and time.monotonic() < deadline:
            found = await asyncio.to_thread(lambda: scrape(metrics_url).find(
                "nv_trt_llm_request_metrics", request_type="active", model="tensorrt_llm"))
            gauge = max(found.values(), default=0.0)
            await asyncio.sleep(0.1)
    except TimeoutError:
        pass
    finally:
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
    return firsts, finishes, gauge


def test_32_chats_without_max_tokens_all_run_at_once(served):
    server, base_url = served
    firsts, finishes, gauge = asyncio.run(_chats_running_at_once(base_url, server.metrics_url))
    started = sum(1 for first in firsts if first is not None)
    assert started == CHATS, f"{started} of {CHATS} chats got a first token (the others waited for KV blocks)"
    assert finishes == [], f"streams ended before every chat had started: {finishes}"
    assert gauge == CHATS, f"the engine's active requests peaked at {gauge}, not {CHATS}"


def test_a_prompt_over_max_num_tokens_is_answered_on_an_idle_server(served):
    """max_input_len (4096) is no longer capped by max_num_tokens (2048): such a prompt is prefilled in chunks, and
    alone on the engine its second chunk must not wait for other work (it did, forever, before a22946b)."""
    _server, base_url = served
    prompt = [1000 + (i * 7919) % 40000 for i in range(2100)]
    with OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=180) as client:
        completion = client.completions.create(model="tensorrt_llm", prompt=prompt, max_tokens=2,
                                               extra_body={"ignore_eos": True})
    assert completion.usage.prompt_tokens == 2100 and completion.usage.completion_tokens == 2



def test_a_request_is_answered_between_a_long_prompts_prefill_chunks(tmp_path):
    """While a 3,000-token prompt prefills in chunks (max_num_tokens 128: at least 24 of them), a newcomer is admitted,
    prefilled and decoded between its chunks: its whole answer comes before the long prompt's first token. It waited
    for the whole prefill (35 s for 4,096 tokens on a 2-core CPU) when partial prefills took every step's tokens."""
    server = start_server(tmp_path, executor="transformers", models=("tensorrt_llm",),
                          parameters={"max_num_tokens": "128"})
    long_client, new_client = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        # A short request first: the engine has a decode-only step's time to size prompt chunks against.
        assert stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 504, 3575], 8), timeout_s=120).errors == []
        long = long_client.send("tensorrt_llm", token_inputs([1000 + (i * 7919) % 40000 for i in range(3000)], 1),
                                "long")
        time.sleep(1)  # it is admitted and prefilling by now (its prefill takes far longer)
        newcomer = new_client.send("tensorrt_llm", token_inputs([1, 504, 3575, 314, 2866], 4,
                                                                min_tokens=(4, np.int32)), "newcomer")
        newcomer.wait(300)
        long_had_a_token = bool(long.responses)
        long.wait(300)
    finally:
        long_client.close()
        new_client.close()
        server.stop()
    assert newcomer.errors == [] and len(newcomer.tokens()) == 4
    assert long.errors == [] and len(long.tokens()) == 1
    assert not long_had_a_token, "the newcomer was answered only after the long prompt's prefill"
