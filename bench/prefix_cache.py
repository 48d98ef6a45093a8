"""Prefix caching in the embedded engine (issue 25): time to first token with a cached 1,000-token system prompt
against an uncached one, and the block hit rate over a small multi-turn chat replay.

TTFT: for each of --pairs distinct system prompts (--system-tokens tokens of varied text), a "cold" request (its
system prompt never seen) and then a "warm" one (the same system prompt, another question), one at a time, 1 token
each, through TransformersExecutor in this process. Reported: the medians and cold / warm. The same with
enable_kv_cache_reuse off as the control (warm should then cost what cold does).
Chat replay: --conversations chats of --turns turns, interleaved turn by turn (as users would be); each turn's
prompt is the chat template over the whole history (the model's earlier answers included), greedy, up to
--max-tokens tokens. Reported: the engine's block hit rate (reused / (reused + missed) full prompt blocks) and the
share of prompt tokens not prefilled.

Run: `.venv/bin/python bench/prefix_cache.py` (about 3 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.embedded.model_loading import load_model  # noqa: E402
from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402
from trtllm_model.pipeline.detokenizer import chat_prompt_ids  # noqa: E402

TOPICS = ["harbour logistics", "a mountain railway", "a public library", "an orchard", "a bicycle workshop",
          "a weather station", "a ferry company", "a bakery cooperative", "a school choir", "a night market"]
QUESTIONS = ["What should I do first?", "Summarise the rules in one line.", "Who is in charge on Sundays?",
             "What happens when it rains?"]
CHAT_TURNS = ["Tell me a fact about {}.", "Why is that?", "Give me one more detail.", "Thanks. Summarise it."]


def system_prompt(tokenizer, topic: str, tokens: int) -> str:
    """Varied rule text about `topic`, cut to about `tokens` tokens."""
    lines, index = [], 0
    while len(tokenizer.encode(" ".join(lines))) < tokens:
        index += 1
        lines.append(f"Rule {index} of the {topic} handbook: staff member {index * 7 % 31} checks item "
                     f"{index * 13 % 97} before shift {index % 5}, and reports {index * 3 % 11} issues in writing.")
    text = " ".join(lines)
    return tokenizer.decode(tokenizer.encode(text)[:tokens])


def run(executor: TransformersExecutor, prompt: list[int], max_tokens: int) -> tuple[float, list[int], int | None]:
    """One request alone: (seconds to its first token, its tokens, reused blocks)."""
    started = time.monotonic()
    request_id = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=max_tokens, return_perf_metrics=True))
    first, tokens, reused = None, [], None
    while True:
        for step in executor.await_steps(5.0):
            if step.request_id != request_id:
                continue
            if step.error:
                raise RuntimeError(step.error)
            if first is None and (step.token_ids or step.is_final):
                first = time.monotonic() - started
            tokens += step.token_ids
            if step.kv_cache_reused_blocks is not None:
                reused = step.kv_cache_reused_blocks
            if step.is_final:
                return first, tokens, reused


def ttft(executor, tokenizer, args, topics: list[str]) -> dict:
    cold, warm, reused = [], [], []
    for topic in topics:
        system = system_prompt(tokenizer, topic, args.system_tokens)
        prompts = [chat_prompt_ids(tokenizer, [{"role": "system", "content": system},
                                               {"role": "user", "content": question}])
                   for question in QUESTIONS[:2]]
        seconds, _, _ = run(executor, prompts[0], 1)
        cold.append(seconds)
        seconds, _, blocks = run(executor, prompts[1], 1)
        warm.append(seconds)
        reused.append(blocks)
    return {"prompt_tokens": len(prompts[1]), "cold_s": cold, "warm_s": warm, "warm_reused_blocks": reused,
            "cold_p50_s": statistics.median(cold), "warm_p50_s": statistics.median(warm),
            "cold_over_warm": statistics.median(cold) / statistics.median(warm)}


def chat_replay(executor, tokenizer, args) -> dict:
    histories = [[] for _ in range(args.conversations)]
    prompt_tokens = reused_tokens = 0
    blocks = executor.engine.blocks
    reused_before, missed_before = blocks.total_reused, blocks.total_missed
    for turn in range(args.turns):
        for conversation, history in enumerate(histories):
            history.append({"role": "user", "content": CHAT_TURNS[turn % len(CHAT_TURNS)].format(
                TOPICS[conversation % len(TOPICS)])})
            prompt = chat_prompt_ids(tokenizer, history)
            _, tokens, reused = run(executor, prompt, args.max_tokens)
            history.append({"role": "assistant", "content": tokenizer.decode(tokens, skip_special_tokens=True)})
            prompt_tokens += len(prompt)
            reused_tokens += (reused or 0) * blocks.block_size
    reused, missed = blocks.total_reused - reused_before, blocks.total_missed - missed_before
    return {"requests": args.conversations * args.turns, "prompt_tokens": prompt_tokens, "reused_blocks": reused,
            "missed_blocks": missed, "block_hit_rate": reused / (reused + missed) if reused + missed else 0.0,
            "prompt_tokens_not_prefilled": reused_tokens / prompt_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=5, help="cold/warm pairs, each with its own system prompt")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per chat answer (default 24)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--results-dir", default=None, help="also write prefix-cache-<time>.json there")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    tokenizer = loaded.tokenizer
    results: dict = {"args": vars(args)}
    with torch.inference_mode():
        for reuse in (True, False):
            executor = TransformersExecutor(loaded.model, tokenizer, max_num_tokens=4096, enable_kv_cache_reuse=reuse)
            try:
                run(executor, chat_prompt_ids(tokenizer, [{"role": "user", "content": "hi"}]), 2)  # warm-up
                # Each setting gets system prompts of its own, so nothing is cached before its cold request.
                topics = TOPICS[: args.pairs] if reuse else [f"{t} (control)" for t in TOPICS[: args.pairs]]
                key = "reuse_on" if reuse else "reuse_off"
                results[key] = {"ttft": ttft(executor, tokenizer, args, topics)}
                if reuse:
                    results[key]["chat_replay"] = chat_replay(executor, tokenizer, args)
            finally:
                executor.shutdown()
    for key in ("reuse_on", "reuse_off"):
        t = results[key]["ttft"]
        print(f"enable_kv_cache_reuse={key == 'reuse_on'!s:5}: prompt {t['prompt_tokens']} tokens, TTFT p50 cold "
              f"{t['cold_p50_s'] * 1000:.0f} ms, warm {t['warm_p50_s'] * 1000:.0f} ms, cold/warm "
              f"{t['cold_over_warm']:.2f}x (warm reused blocks {t['warm_reused_blocks']})")
    chat = results["reuse_on"]["chat_replay"]
    print(f"chat replay: {chat['requests']} requests, {chat['prompt_tokens']} prompt tokens, block hit rate "
          f"{chat['block_hit_rate']:.2f} ({chat['reused_blocks']} reused / {chat['missed_blocks']} missed), "
          f"{chat['prompt_tokens_not_prefilled']:.0%} of prompt tokens not prefilled")
    if args.results_dir:
        path = Path(args.results_dir) / time.strftime("prefix-cache-%Y%m%d-%H%M%S.json", time.gmtime())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))
        print(f"results: {path}")


if __name__ == "__main__":
    main()
