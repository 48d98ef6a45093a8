"""Throughput of the transformers executor (in-flight batching) against plain `model.generate`.

Same prompts (chat-formatted questions of different lengths), same output length for every request (min_tokens =
max_tokens, so no request ends early), greedy, one run each:
  executor @ c   the prompts through TransformersExecutor with at most c requests in flight (a closed loop)
  sequential     model.generate on one prompt at a time
  static         one model.generate over all prompts, left-padded into one batch
Tokens/s counts generated tokens only. Run: `.venv/bin/python bench/engine.py` (about 10 minutes on 2 CPU cores);
shorter: `--max-tokens 16 --prompts 8 --levels 1,8`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.detokenizer import apply_chat_template  # noqa: E402
from trtllm_model.embedded.model_loading import load_model  # noqa: E402
from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in simple terms for a ten year old who likes plants.",
    "hi",
    "List three primary colors and one thing that has each color.",
    "Who wrote Hamlet?",
    "Translate 'good morning, how are you today?' to French and to Spanish.",
    "What is 17 times 23?",
    "Give me a short tip for learning to cook at home on a budget.",
    "Why is the sky blue?",
    "Describe a cat in one sentence.",
    "What are the benefits of regular exercise for older adults, briefly?",
    "Name a famous painting.",
    "How do airplanes stay in the air? Keep it short, please.",
    "Suggest a name for a small bakery by the river.",
    "What is the boiling point of water at sea level in Celsius and Fahrenheit?",
]


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)]
        if i >= len(QUESTIONS):
            question += " Answer as a pirate would." * (1 + i // len(QUESTIONS))
        prompts.append(tokenizer.encode(apply_chat_template(tokenizer, question)))
    return prompts


def run_executor(executor: TransformersExecutor, prompts: list[list[int]], max_tokens: int, concurrency: int):
    """All prompts with at most `concurrency` in flight; returns (generated tokens, wall seconds, TTFTs)."""
    queue = list(prompts)
    started, first_token, tokens, open_ids = {}, {}, 0, set()
    begin = time.monotonic()
    while queue or open_ids:
        while queue and len(open_ids) < concurrency:
            request = GenerationRequest(input_ids=queue.pop(0), max_tokens=max_tokens, min_tokens=max_tokens)
            request_id = executor.enqueue(request)
            started[request_id] = time.monotonic()
            open_ids.add(request_id)
        for step in executor.await_steps(5.0):
            if step.token_ids and step.request_id not in first_token:
                first_token[step.request_id] = time.monotonic() - started[step.request_id]
            tokens += len(step.token_ids)
            if step.is_final:
                open_ids.discard(step.request_id)
    return tokens, time.monotonic() - begin, list(first_token.values())


def run_sequential(model, prompts: list[list[int]], max_tokens: int, pad_id: int) -> tuple[int, float]:
    tokens, begin = 0, time.monotonic()
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
        tokens += out.shape[1] - len(prompt)
    return tokens, time.monotonic() - begin


def run_static(model, prompts: list[list[int]], max_tokens: int, pad_id: int) -> tuple[int, float]:
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    begin = time.monotonic()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=pad_id,
    )
    return (out.shape[1] - width) * len(prompts), time.monotonic() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32, help="requests per measurement (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--levels", default="1,8,32", help="executor concurrency levels (default 1,8,32)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--skip-sequential", action="store_true", help="skip the one-at-a-time generate baseline")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    levels = [int(level) for level in args.levels.split(",") if level]

    loaded = load_model()
    model, tokenizer = loaded.model, loaded.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = chat_prompts(tokenizer, args.prompts)
    lengths = [len(prompt) for prompt in prompts]
    print(
        f"{len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens, {args.max_tokens} new tokens each, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )

    rows = []  # (name, concurrency, tokens, seconds, ttft p50)
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=2, do_sample=False, pad_token_id=pad_id)  # warm-up
        executor = TransformersExecutor(model, tokenizer, max_batch_size=max(levels), max_num_tokens=4096)
        try:
            for level in levels:
                tokens, seconds, ttfts = run_executor(executor, prompts, args.max_tokens, level)
                rows.append((f"executor @ {level}", level, tokens, seconds, statistics.median(ttfts)))
                print(f"  done: {rows[-1][0]}: {tokens / seconds:.1f} tok/s", flush=True)
        finally:
            executor.shutdown()
        if not args.skip_sequential:
            tokens, seconds = run_sequential(model, prompts, args.max_tokens, pad_id)
            rows.append(("generate, sequential", 1, tokens, seconds, None))
            print(f"  done: sequential: {tokens / seconds:.1f} tok/s", flush=True)
        tokens, seconds = run_static(model, prompts, args.max_tokens, pad_id)
        rows.append((f"generate, static batch of {len(prompts)}", len(prompts), tokens, seconds, None))
        print(f"  done: static: {tokens / seconds:.1f} tok/s", flush=True)

    rate = {name: tokens / seconds for name, _, tokens, seconds, _ in rows}
    sequential = rate.get("generate, sequential")
    static = rate[rows[-1][0]]
    print()
    print(
        f"| {'method':<30} | {'in flight':>9} | {'tokens':>6} | {'wall s':>7} | {'tok/s':>6} | "
        f"{'TTFT p50 s':>10} | {'vs sequential':>13} | {'vs static':>9} |"
    )
    print(f"|{'-' * 32}|{'-' * 11}|{'-' * 8}|{'-' * 9}|{'-' * 8}|{'-' * 12}|{'-' * 15}|{'-' * 11}|")
    for name, level, tokens, seconds, ttft in rows:
        versus_sequential = f"{rate[name] / sequential:.2f}x" if sequential else "-"
        ttft_text = f"{ttft:.2f}" if ttft is not None else "-"
        print(
            f"| {name:<30} | {level:>9} | {tokens:>6} | {seconds:>7.1f} | {rate[name]:>6.1f} | {ttft_text:>10} | "
            f"{versus_sequential:>13} | {rate[name] / static:>8.2f}x |"
        )


if __name__ == "__main__":
    main()
