"""What a JSON-schema guide costs the embedded engine: generated tokens/s with the guide against none, per number of
streams in flight (a closed loop over the transformers executor, in-process, greedy).

Every request generates exactly --max-tokens tokens: the unguided ones through min_tokens = max_tokens (as
bench/engine.py), the guided ones because the schema asks for more items than fit (an array of at least 40
objects), so their grammar never ends early. Each level runs unguided and guided in turn, --rounds times, and
reports the median of each (the first round also warms the prefix cache for both). On a machine shared with other
work, tokens/s moves with the neighbours' load; the last column is steadier: the share of the guided runs' wall
time the engine thread spent in guided.py (filling and applying the bitmask, advancing the matchers).
Run: `.venv/bin/python bench/guided.py` (about 15 minutes on 2 busy CPU cores); shorter: `--levels 1,16 --rounds 1`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import trtllm_model.embedded.sampling as sampling_module
import trtllm_model.embedded.sequence as sequence_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine import chat_prompts  # noqa: E402
from trtllm_model.embedded.model_loading import default_dtype, load_model  # noqa: E402
from trtllm_model.executor_interface import FinishReason, GenerationRequest  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "notes": {
            "type": "array",
            "minItems": 40,
            "items": {
                "type": "object",
                # No maxLength: xgrammar fills a bounded string's mask slowly (about 11 ms a row mid-string on
                # this machine, against 0.03 ms unbounded; docs/history/2026-12-02-03-serving-layer-and-first-gpu-host.md).
                "properties": {"topic": {"type": "string"}, "score": {"type": "integer"}, "done": {"type": "boolean"}},
                "required": ["topic", "score", "done"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["notes"],
    "additionalProperties": False,
}


class GuideTimer:
    """Wraps the engine's two guided.py hooks to add up the time spent in them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        sampling_module.mask_guided_logits = self._timed(sampling_module.mask_guided_logits)
        sequence_module.advance = self._timed(sequence_module.advance)

    def _timed(self, function):
        def timed(*args):
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def run(executor: TransformersExecutor, prompts: list[list[int]], max_tokens: int, concurrency: int,
        guided: bool) -> tuple[int, float]:
    """All prompts with at most `concurrency` in flight; (generated tokens, wall seconds)."""
    queue, open_ids, tokens = list(prompts), set(), 0
    begin = time.monotonic()
    while queue or open_ids:
        while queue and len(open_ids) < concurrency:
            if guided:
                request = GenerationRequest(queue.pop(0), max_tokens, guided_decoding_type="json_schema",
                                            guided_decoding_guide=json.dumps(SCHEMA))
            else:
                request = GenerationRequest(queue.pop(0), max_tokens, min_tokens=max_tokens)
            open_ids.add(executor.enqueue(request))
        for step in executor.await_steps(5.0):
            if step.error:
                raise RuntimeError(step.error)
            tokens += len(step.token_ids)
            if step.is_final:
                if step.finish_reason is not FinishReason.LENGTH:
                    raise RuntimeError(f"a request ended early ({step.finish_reason}): the comparison needs "
                                       "every request to generate max_tokens")
                open_ids.discard(step.request_id)
    return tokens, time.monotonic() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="16,64,1", help="streams in flight (default 16,64,1)")
    parser.add_argument("--prompts", type=int, default=8, help="requests per run: at least this and the level")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--rounds", type=int, default=2, help="unguided/guided pairs per level (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(device=args.device, dtype=default_dtype(args.device))  # the executor's default
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=64, max_num_tokens=4096)
    try:
        # Warm-up (and the schema compiled once: a compile is per distinct guide, cached afterwards).
        run(executor, chat_prompts(loaded.tokenizer, 2), 8, 2, guided=False)
        run(executor, chat_prompts(loaded.tokenizer, 2), 8, 2, guided=True)
        timer = GuideTimer()
        print("| streams | unguided tok/s | JSON-schema guide tok/s | guided / unguided | guide's share of guided wall time |")
        print("|---:|---:|---:|---:|---:|")
        for level in [int(x) for x in args.levels.split(",")]:
            prompts = chat_prompts(loaded.tokenizer, max(level, args.prompts))
            rates: dict[bool, list[float]] = {False: [], True: []}
            guide_seconds, guided_seconds = 0.0, 0.0
            for _ in range(args.rounds):
                for guided in (False, True):
                    before = timer.seconds
                    tokens, seconds = run(executor, prompts, args.max_tokens, level, guided)
                    rates[guided].append(tokens / seconds)
                    if guided:
                        guide_seconds += timer.seconds - before
                        guided_seconds += seconds
            free, guided_rate = statistics.median(rates[False]), statistics.median(rates[True])
            print(f"| {level} | {free:.1f} | {guided_rate:.1f} | {guided_rate / free:.3f} | "
                  f"{guide_seconds / guided_seconds:.1%} |", flush=True)
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
