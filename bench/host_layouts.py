"""The embedded engine's host work at N streams in its two layouts, on this machine: the engine on a thread of this
process, and the engine in its worker process (executors/engine_client.py, CUDA's default layout), both host-only.

    .venv/bin/python bench/host_layouts.py                       # 256 streams, 3 turns of 3 rounds, about 2 minutes

Host-only (bench/host_only.py): the forward computes nothing, the steps go as on CUDA (static shapes, overlapped
steps, CUDA's decode steps an iteration unless --decode-steps says otherwise), so a round's time is the engine's
Python and the steps' way to the caller; on an H200 a 256-stream decode step
is bound by that host work. A tiny random checkpoint (bench/tiny_checkpoint.py) is loaded by both layouts. A round:
N chat prompts, 64 new tokens each, all in flight (bench/engine.py's closed loop). The layouts alternate turn by turn,
each going first in turn. Printed per layout: each round's tokens/s and time to first token (p50 of its requests), the
medians, and the median milliseconds between two iterations that decoded every stream (from the engine's iteration
stats, so the same measure in both layouts); then process over thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import host_only  # noqa: E402  (bench/, this script's directory: also on the worker's sys.path)
from engine import chat_prompts, run_executor  # noqa: E402
from tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

from trtllm_model.embedded.engine import DEFAULT_CUDA_DECODE_STEPS  # noqa: E402
from trtllm_model.embedded.model_loading import load_model  # noqa: E402
from trtllm_model.executors import engine_client  # noqa: E402
from trtllm_model.executors.engine_wire import EngineSpec  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402


def full_step_ms(stats: list, streams: int) -> list[float]:
    """Milliseconds between consecutive iterations that each decoded all `streams` (a round's stats)."""
    full = [stat for stat in stats if stat.generation_requests == streams]
    return [(later.timestamp - earlier.timestamp) * 1000 for earlier, later in zip(full, full[1:])
            if later.iteration == earlier.iteration + 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per layout per turn")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each layout")
    parser.add_argument("--decode-steps", type=int, default=DEFAULT_CUDA_DECODE_STEPS,
                        help=f"the engine's decode steps an iteration (default: CUDA's, {DEFAULT_CUDA_DECODE_STEPS})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    host_only.make_host_only()
    engine_client.engine_worker = host_only  # the worker process starts through host_only.main

    with tempfile.TemporaryDirectory(prefix="host-layouts-") as directory, torch.inference_mode():
        write_tiny_checkpoint(Path(directory))
        loaded = load_model(model_dir=directory)
        prompts = chat_prompts(loaded.tokenizer, args.streams)
        executors = {
            "thread": TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=args.streams,
                                           max_num_tokens=8192, overlap_steps=True, decode_steps=args.decode_steps),
            "process": TransformersExecutor.in_worker_process(EngineSpec(
                model_dir=directory, torch_threads=args.threads, max_batch_size=args.streams, max_num_tokens=8192,
                overlap_steps=True, decode_steps=args.decode_steps)),
        }
        rates: dict[str, list[float]] = {layout: [] for layout in executors}
        steps: dict[str, list[float]] = {layout: [] for layout in executors}
        first_tokens: dict[str, list[float]] = {layout: [] for layout in executors}  # each round's TTFT p50, ms
        prompt_iterations: dict[str, list[int]] = {layout: [] for layout in executors}  # each round's, that prefilled
        try:
            for executor in executors.values():  # warm-up: allocations, the first prompt forwards
                run_executor(executor, prompts, args.max_tokens, args.streams)
            for turn in range(args.turns):
                order = list(executors) if turn % 2 == 0 else list(reversed(executors))
                for layout in order:
                    executor = executors[layout]
                    for _ in range(args.rounds):
                        executor.iteration_stats()  # drop what came before this round
                        tokens, seconds, ttfts = run_executor(executor, prompts, args.max_tokens, args.streams)
                        rates[layout].append(tokens / seconds)
                        first_tokens[layout].append(statistics.median(ttfts) * 1000)
                        stats = executor.iteration_stats()
                        steps[layout] += full_step_ms(stats, args.streams)
                        prompt_iterations[layout].append(sum(1 for stat in stats if stat.context_requests))
                    print(f"turn {turn} {layout}: " + ", ".join(f"{rate:,.0f}" for rate in rates[layout][-args.rounds:])
                          + " tok/s; TTFT p50 " + ", ".join(f"{ms:.1f}" for ms in first_tokens[layout][-args.rounds:])
                          + " ms", flush=True)
        finally:
            for executor in executors.values():
                executor.shutdown()
    medians = {}
    for layout in executors:
        medians[layout] = (statistics.median(rates[layout]), statistics.median(steps[layout]))
        quartiles = statistics.quantiles(steps[layout])
        print(f"{layout}: {len(rates[layout])} rounds, median {medians[layout][0]:,.0f} tok/s "
              f"(spread {(max(rates[layout]) - min(rates[layout])) / medians[layout][0]:.1%}); ms between full decode "
              f"iterations: median {medians[layout][1]:.3f} (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
              f"{len(steps[layout])} iterations); TTFT p50, median of the rounds: "
              f"{statistics.median(first_tokens[layout]):.1f} ms; iterations that prefilled a round: "
              f"{', '.join(str(count) for count in prompt_iterations[layout])}")
    print(f"process / thread: tok/s {medians['process'][0] / medians['thread'][0]:.2f}, "
          f"ms a full decode iteration {medians['process'][1] / medians['thread'][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
