"""A prompt's chunk beside decoding streams on the CPU, in process (SmolLM2, the executor's dtype or --dtype, 2 torch
threads).

    .venv/bin/python bench/prefill_beside_decode.py forwards        # ~2 min: what a step's forwards cost
    .venv/bin/python bench/prefill_beside_decode.py steps 2.5       # ~1 min: the step budget's steps, one run
    .venv/bin/python bench/prefill_beside_decode.py steps 2.5 --no-fused-forward   # transformers' forward, apart
    .venv/bin/python bench/prefill_beside_decode.py newcomer 2.5    # ~4 min: a request beside a long prompt's prefill
    .venv/bin/python bench/prefill_beside_decode.py context 2.5     # ~2 min: a stream beside a context-logits prompt

forwards: milliseconds (median of 7 calls) of a decode step of 16 rows (100-token contexts), of a prompt chunk of 32,
64 or 128 tokens at prefix 0, 1,024 and 1,920, with transformers' forward and with fused_forward's eager pieces,
and of the decode rows and the chunk in two forwards against one (`ModelRunner.mixes_prompts`).

steps: 16 streams decode (60-token prompts), then a 2,048-token prompt arrives; prints the engine's steps while it
prefills (decoding rows, prompt tokens, ms, the budget's next chunk) and its time to first token, with the executor's
`prefill_stall_factor` as given.

newcomer: a 4,096-token prompt prefills on an idle engine (max_num_tokens 2,048, max_input_len 4,096, the factor as
given); 1 s in, a 5-token request arrives. Prints its time to first token against its time alone (median of 3, same
run), and the long prompt's time to first token against the same prompt's alone.

context: one stream decodes; a 1,000-token prompt arrives, without and then with return_context_logits. Prints the
stream's longest wait between tokens while each is prefilled and answered.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from trtllm_model.embedded import step_budget
from trtllm_model.embedded.fused_forward import FusedForward
from trtllm_model.embedded.kv_cache import StepInputs
from trtllm_model.embedded.model_loading import default_dtype, load_model
from trtllm_model.embedded.runner import ModelRunner
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.transformers_executor import TransformersExecutor

BLOCK_SIZE = 16


def decode_inputs(rows: int, context: int) -> StepInputs:
    """One query a row at position `context - 1`, each row's blocks its own (blocks 1-290)."""
    width = -(-context // BLOCK_SIZE)
    tables = np.arange(rows * width).reshape(rows, width) % 290 + 1
    positions = np.full((rows, 1), context - 1)
    slots = tables[:, -1] * BLOCK_SIZE + (context - 1) % BLOCK_SIZE
    return StepInputs(torch.zeros((rows, 1), dtype=torch.long), torch.from_numpy(positions), torch.from_numpy(slots),
                      torch.from_numpy(tables))


def chunk_inputs(start: int, tokens: int) -> StepInputs:
    """One row: a chunk of `tokens` queries at positions `start..`, over blocks 300 on."""
    tables = (np.arange(-(-(start + tokens) // BLOCK_SIZE)) + 300)[None, :]
    positions = np.arange(start, start + tokens)[None, :]
    slots = tables[0, positions[0] // BLOCK_SIZE] * BLOCK_SIZE + positions[0] % BLOCK_SIZE
    return StepInputs(torch.zeros((1, tokens), dtype=torch.long), torch.from_numpy(positions),
                      torch.from_numpy(slots), torch.from_numpy(tables))


def median_ms(forward: Callable[..., object], *parts: StepInputs, calls: int = 7) -> float:
    """A forward of `parts`, timed after one call to warm it."""
    forward(*parts)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        forward(*parts)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def forwards(dtype: str) -> None:
    model = load_model(dtype=dtype).model
    runner = ModelRunner(model, fused_forwards=False)
    pool = runner.allocate_kv_pool(600, BLOCK_SIZE)
    fused = FusedForward(model, compile=False)
    decode = decode_inputs(16, 100)
    def fused_parts(*parts: StepInputs) -> torch.Tensor:
        return fused(list(parts), pool)

    with torch.inference_mode():
        for label, forward in (("transformers", runner._forward), ("fused", fused_parts)):
            print(f"decode, {label}: 1 row {median_ms(forward, decode_inputs(1, 100)):.1f} ms, 16 rows "
                  f"{median_ms(forward, decode):.1f} ms", flush=True)
        decode_ms = median_ms(fused_parts, decode)
        print("chunk at prefix | transformers | fused | fused: decode 16 + chunk apart | in one forward")
        for start in (0, 1024, 1920):
            for tokens in (32, 64, 128):
                chunk = chunk_inputs(start, tokens)
                alone = median_ms(fused_parts, chunk)
                print(f"{tokens:4d} at {start:4d} | {median_ms(runner._forward, chunk):6.1f} | {alone:6.1f} | "
                      f"{decode_ms + alone:6.1f} | {median_ms(fused_parts, decode, chunk):6.1f}", flush=True)


def steps(factor: float, fused: bool, dtype: str) -> None:
    log: list[tuple[int, int, float, int]] = []
    observe = step_budget.StepBudget.observe

    def recording(self, decoding: int, prompt_tokens: int, seconds: float) -> None:
        observe(self, decoding, prompt_tokens, seconds)
        log.append((decoding, prompt_tokens, seconds * 1000, self.chunk))

    step_budget.StepBudget.observe = recording
    loaded = load_model(dtype=dtype)
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=32, max_num_tokens=2048,
                                    prefill_stall_factor=factor, fused_forward=fused)
    rng = random.Random(1)
    try:
        streams = [executor.enqueue(GenerationRequest(input_ids=[rng.randrange(100, 40000) for _ in range(60)],
                                                      max_tokens=400, end_id=-1)) for _ in range(16)]
        started = time.monotonic()
        while time.monotonic() - started < 4:
            executor.await_steps(0.5)
        before = len(log)
        prompt = [rng.randrange(100, 40000) for _ in range(2048)]
        long_id = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=4, end_id=-1))
        sent, first = time.monotonic(), None
        while first is None:
            if any(step.request_id == long_id and step.token_ids for step in executor.await_steps(0.5)):
                first = time.monotonic() - sent
        decode_only = statistics.median(ms for decoding, tokens, ms, _ in log[:before] if decoding and not tokens)
        chunked = [entry for entry in log[before:] if entry[1]]
        for decoding, tokens, ms, chunk in chunked:
            print(f"decoding {decoding:2d}, prompt tokens {tokens:4d}: {ms:6.1f} ms; next chunk {chunk}")
        worst = max(ms for _, _, ms, _ in chunked)
        print(f"{dtype}, {'fused, one forward' if fused else 'transformers, apart'}, factor {factor}: TTFT {first:.2f} s; "
              f"{len(chunked)} steps with a chunk, median {statistics.median(e[2] for e in chunked):.0f} ms, worst "
              f"{worst:.0f} ms; decode-only step median {decode_only:.0f} ms (worst {worst / decode_only:.2f}x)")
        for request_id in streams:
            executor.cancel(request_id)
    finally:
        executor.shutdown()


def first_token_s(executor: TransformersExecutor, request_id: int, sent: float, firsts: dict[int, float]) -> float:
    """Seconds from `sent` to `request_id`'s first token, reading steps (and noting every request's first token)."""
    while request_id not in firsts:
        for step in executor.await_steps(0.5):
            if step.token_ids and step.request_id not in firsts:
                firsts[step.request_id] = time.monotonic()
    return firsts[request_id] - sent


def newcomer(factor: float, dtype: str) -> None:
    loaded = load_model(dtype=dtype)
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=32, max_num_tokens=2048,
                                    max_input_len=4096, prefill_stall_factor=factor)
    rng = random.Random(1)
    firsts: dict[int, float] = {}

    def small() -> float:
        sent = time.monotonic()
        request = GenerationRequest(input_ids=[1, 504, 3575, 314, 2866], max_tokens=8, end_id=-1)
        return first_token_s(executor, executor.enqueue(request), sent, firsts)

    def long() -> tuple[int, float]:
        request = GenerationRequest(input_ids=[rng.randrange(100, 40000) for _ in range(4096)], max_tokens=1, end_id=-1)
        return executor.enqueue(request), time.monotonic()

    try:
        alone = statistics.median(small() for _ in range(3))
        long_alone = first_token_s(executor, *long(), firsts)
        time.sleep(1)
        long_id, long_sent = long()
        time.sleep(1)
        beside = small()
        long_beside = first_token_s(executor, long_id, long_sent, firsts)
        print(f"{dtype}, factor {factor}: newcomer TTFT {beside:.2f} s beside a 4,096-token prefill, {alone:.2f} s "
              f"alone ({beside / alone:.1f}x); the long prompt's TTFT {long_beside:.1f} s, {long_alone:.1f} s alone "
              f"({long_beside / long_alone:.2f}x)", flush=True)
    finally:
        executor.shutdown()


def longest_gap_s(executor: TransformersExecutor, prompt: list[int], context_logits: bool) -> float:
    """The longest wait between a decoding stream's tokens while `prompt` is prefilled and answered beside it."""
    stream = executor.enqueue(GenerationRequest(input_ids=[1, 504, 3575], max_tokens=4000, min_tokens=4000, end_id=-1))
    while not any(step.request_id == stream and step.token_ids for step in executor.await_steps(0.5)):
        pass
    asked = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=1, end_id=-1,
                                               return_context_logits=context_logits))
    arrivals, answered = [time.monotonic()], False
    while not answered:
        for step in executor.await_steps(0.5):
            if step.request_id == stream and step.token_ids:
                arrivals.append(time.monotonic())
            answered = answered or (step.request_id == asked and step.is_final)
    arrivals.append(time.monotonic())
    executor.cancel(stream)
    return max(later - earlier for earlier, later in zip(arrivals, arrivals[1:]))


def context(factor: float, dtype: str) -> None:
    loaded = load_model(dtype=dtype)
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=32, max_num_tokens=2048,
                                    max_input_len=4096, prefill_stall_factor=factor)
    rng = random.Random(1)
    try:
        gaps = [longest_gap_s(executor, [rng.randrange(100, 40000) for _ in range(1000)], wanted) for wanted in (False, True)]
        print(f"{dtype}, factor {factor}: a stream's longest wait beside a 1,000-token prompt {gaps[0]:.2f} s, "
              f"{gaps[1]:.2f} s when it asks for its context logits", flush=True)
    finally:
        executor.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["forwards", "steps", "newcomer", "context"])
    parser.add_argument("factor", type=float, nargs="?", default=2.5, help="steps: prefill_stall_factor")
    parser.add_argument("--fused-forward", action=argparse.BooleanOptionalAction, default=True,
                        help="steps: fused forwards, the chunk in the decode step's forward (default) or not")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                        help="the model's weights (default: the executor's on this CPU)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    args.dtype = args.dtype or default_dtype("cpu")
    if args.what == "forwards":
        forwards(args.dtype)
    elif args.what == "newcomer":
        newcomer(args.factor, args.dtype)
    elif args.what == "context":
        context(args.factor, args.dtype)
    else:
        steps(args.factor, args.fused_forward, args.dtype)


if __name__ == "__main__":
    main()
