"""Per-iteration timeline of the engine at N streams (bench/engine.py's chat prompts, 64 new tokens each): the
first iterations (those that prefill) apart from the rest, each with its wall ms and the engine thread's ms per
phase; then, on CUDA, one round under torch.profiler: the GPU's busy time (union of its kernels and copies) against
the wall time.

    bash bench/gpu/run_on_gpu.sh python bench/gpu/iteration_timeline.py real 256 3        # SmolLM2, 3 rounds
    bash bench/gpu/run_on_gpu.sh python bench/gpu/iteration_timeline.py tiny 256 2 fake   # host work only
    PREFILL_FORWARD_COST=inf bash bench/gpu/run_on_gpu.sh python bench/gpu/iteration_timeline.py real 256 3

`fake`: the forward computes nothing (zero logits), so what is left is the engine's host work; on the CPU too the
steps then go as on CUDA (static shapes, overlapped steps), so this machine can stand in for a GPU host's Python:
`.venv/bin/python bench/gpu/iteration_timeline.py tiny 256 15 fake` (the median round is printed last); `DECODE_STEPS=1` sets the
engine's decode steps an iteration (default: CUDA's, host-only too). `PREFILL_FORWARD_COST`: what
a prompt forward counts as in `scheduler.prefill_groups`, in tokens (`inf`: every iteration's prompts in one forward). Issue 33's runs of 2026-12-04 (docs/history/2026-12-04-engine-on-the-h200.md)
ran this script as `.gpu/timeline.py` (the same code, reformatted since).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine import chat_prompts, run_executor  # noqa: E402
from host_only import make_host_only  # noqa: E402
from step_profile import tiny_model  # noqa: E402

from trtllm_model.embedded import runner as runner_module  # noqa: E402
from trtllm_model.embedded.engine import Engine  # noqa: E402

try:
    from trtllm_model.embedded.engine import DEFAULT_CUDA_DECODE_STEPS
except ImportError:  # a tree from before decode_steps (A/B runs)
    DEFAULT_CUDA_DECODE_STEPS = None
from trtllm_model.embedded.model_loading import load_model, load_tokenizer  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402

Record = tuple[float, dict[str, float], float]  # (iteration seconds, seconds per phase, engine thread CPU seconds)
Forward = tuple[int, int, int, float]  # a prompt forward: (iteration, rows, queries, host ms from call to return)


def recording(records: list[Record]):
    """Engine._next_iteration that appends each iteration's wall seconds and phase seconds to `records`."""
    original = Engine._next_iteration

    def next_iteration(self):
        before, started, cpu = dict(self.phase_seconds), time.perf_counter(), time.thread_time()
        result = original(self)
        phases = {phase: seconds - before.get(phase, 0.0) for phase, seconds in self.phase_seconds.items()}
        records.append((time.perf_counter() - started, phases, time.thread_time() - cpu))
        return result

    return next_iteration


def timing_prefill(forwards: list[Forward], records: list[Record]):
    """ModelRunner.prefill that appends each prompt forward's shape and host milliseconds to `forwards`."""
    original = runner_module.ModelRunner.prefill

    def prefill(self, sequences):
        started = time.perf_counter()
        logits = original(self, sequences)
        queries = max(sequence.prefill_len for sequence in sequences)
        forwards.append((len(records), len(sequences), queries, (time.perf_counter() - started) * 1000))
        return logits

    return prefill


def show(label: str, records: list[Record]) -> None:
    if not records:
        return
    wall = sum(record[0] for record in records) * 1000
    phases: dict[str, float] = {}
    for _, split, _ in records:
        for phase, seconds in split.items():
            phases[phase] = phases.get(phase, 0.0) + seconds * 1000
    count = len(records)
    cpu = sum(record[2] for record in records) * 1000
    print(f"  {label}: {count} it, {wall:.1f} ms ({cpu:.1f} ms on the engine thread's CPU), {wall / count:.2f} ms/it;",
          ", ".join(f"{phase} {ms / count:.2f}" for phase, ms in phases.items()), flush=True)


def gpu_busy_us(profiler) -> tuple[float, float, int]:
    """(busy microseconds: the union of the device's intervals, first to last microseconds, intervals)."""
    intervals = sorted((event.time_range.start, event.time_range.end) for event in profiler.events()
                       if event.device_type == torch.autograd.DeviceType.CUDA)
    busy, start, end = 0.0, None, None
    for begin, finish in intervals:
        if end is None or begin > end:
            if end is not None:
                busy += end - start
            start, end = begin, finish
        else:
            end = max(end, finish)
    if end is not None:
        busy += end - start
    span = intervals[-1][1] - intervals[0][0] if intervals else 0.0
    return busy, span, len(intervals)


def main() -> None:
    which, level, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(4)
    fake = len(sys.argv) > 4 and sys.argv[4] == "fake"
    if fake:
        make_host_only()
    records: list[Record] = []
    forwards: list[Forward] = []
    Engine._next_iteration = recording(records)
    runner_module.ModelRunner.prefill = timing_prefill(forwards, records)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer()
    prompts = chat_prompts(tokenizer, level)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if which == "tiny":
        model = tiny_model().to(device=device, dtype=dtype)
    else:
        model = load_model(device=device, dtype=str(dtype).split(".")[1]).model
    with torch.inference_mode():
        started = time.perf_counter()
        # DECODE_STEPS: the engine's decode steps an iteration (default: CUDA's, also host-only); unset on trees
        # from before decode_steps (A/B runs) unless given.
        steps = int(os.environ.get("DECODE_STEPS", "0")) or (DEFAULT_CUDA_DECODE_STEPS if fake else None)
        executor = TransformersExecutor(model, tokenizer, max_batch_size=level, max_num_tokens=8192,
                                        overlap_steps=device == "cuda" or fake,
                                        **({"decode_steps": steps} if steps else {}))
        print(f"decode steps an iteration: {executor.engine.config.decode_steps}", flush=True)
        if os.environ.get("PREFILL_FORWARD_COST"):
            executor.runner.prefill_forward_cost_tokens = float(os.environ["PREFILL_FORWARD_COST"])
        # getattr: the script also runs over trees from before prefill_forward_cost_tokens (A/B runs).
        print(f"a prompt forward counted as {getattr(executor.runner, 'prefill_forward_cost_tokens', '-')} tokens",
              flush=True)
        run_executor(executor, prompts, 64, level)
        print(f"engine up and first round in {time.perf_counter() - started:.1f} s; prompt buckets captured: "
              f"{len(getattr(executor.runner, 'prefill_buckets', ()))}", flush=True)
        rates = []
        for round_ in range(rounds):
            records.clear()
            forwards.clear()
            tokens, seconds, ttfts = run_executor(executor, prompts, 64, level)
            done = [record for record in records if record[1]]
            rates.append(tokens / seconds)
            print(f"round {round_}: {tokens / seconds:.0f} tok/s, {seconds * 1000:.1f} ms, ttft p50 "
                  f"{sorted(ttfts)[len(ttfts) // 2] * 1000:.0f} ms", flush=True)
            first = 0  # the leading iterations that prefill
            while first < len(done) and (first < 1 or done[first][1].get("prefill", 0) > 0.0002):
                first += 1
            show("first iterations (prefill)", done[:first])
            show("rest", done[first:])
            print("   first 6 it ms:", [round(record[0] * 1000, 2) for record in done[:6]], "prefill ms:",
                  [round(record[1].get("prefill", 0) * 1000, 2) for record in done[:6]], "CPU ms:",
                  [round(record[2] * 1000, 2) for record in done[:6]])
            print("   prompt forwards (iteration, rows x queries, host ms):",
                  ", ".join(f"{it}: {rows}x{queries} {ms:.1f}" for it, rows, queries, ms in forwards))
        print(f"median of {rounds} rounds: {sorted(rates)[len(rates) // 2]:.0f} tok/s", flush=True)
        if device == "cuda":
            from torch.profiler import ProfilerActivity, profile

            records.clear()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as profiler:
                started = time.perf_counter()
                tokens, seconds, _ = run_executor(executor, prompts, 64, level)
                torch.cuda.synchronize()
                wall = time.perf_counter() - started
            busy, span, events = gpu_busy_us(profiler)
            print(f"profiled round: {tokens / seconds:.0f} tok/s, wall {wall * 1000:.1f} ms; GPU first-to-last "
                  f"{span / 1000:.1f} ms, busy {busy / 1000:.1f} ms, {events} device events")
            show("profiled, all", [record for record in records if record[1]])
        executor.shutdown()


if __name__ == "__main__":
    main()
