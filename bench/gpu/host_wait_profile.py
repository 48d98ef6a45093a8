"""Where the engine thread's host time goes in one N-stream round of bench/engine.py's chat prompts: torch.profiler
over every thread (CPU ops and, on CUDA, the runtime calls such as cudaStreamSynchronize, cudaMemcpyAsync or
cudaHostAlloc), self time summed by name, over the round's first 120 ms (the prompt iterations at 256 streams) and
over the whole round. A call that waits for the device shows as a large self time.

    bash bench/gpu/run_on_gpu.sh python bench/gpu/host_wait_profile.py 256    # SmolLM2 on the GPU
    .venv/bin/python bench/gpu/host_wait_profile.py 16                         # a dry run: a tiny model on the CPU

Written after issue 33's runs of 2026-12-04: the prompt iterations' prefill phase took 26-44 ms an iteration on an
H200, with or without CUDA graphs for the prompt forwards, so something there waits; not run on the GPU yet.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine import chat_prompts, run_executor  # noqa: E402
from step_profile import tiny_model  # noqa: E402

from trtllm_model.embedded.model_loading import load_model, load_tokenizer  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402


def print_top(events: list, label: str, window_ms: float, top: int = 16) -> None:
    """Self time by name of the events that start within `window_ms` of the first."""
    start = min(event.time_range.start for event in events)
    totals: dict[str, list[float]] = {}
    for event in events:
        if event.time_range.start - start > window_ms * 1000:
            continue
        total = totals.setdefault(event.name, [0.0, 0, 0.0])
        total[0] += event.self_cpu_time_total
        total[1] += 1
        total[2] = max(total[2], event.self_cpu_time_total)
    print(f"== {label}: self time ms, calls, longest ms")
    for name, (self_us, calls, longest) in sorted(totals.items(), key=lambda item: -item[1][0])[:top]:
        print(f"  {self_us / 1000:8.2f} {calls:7d} {longest / 1000:7.2f}  {name[:80]}")


def main() -> None:
    level = int(sys.argv[1])
    torch.set_num_threads(4)
    cuda = torch.cuda.is_available()
    tokenizer = load_tokenizer()
    prompts = chat_prompts(tokenizer, level)
    model = load_model(device="cuda", dtype="bfloat16").model if cuda else tiny_model()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode():
        executor = TransformersExecutor(model, tokenizer, max_batch_size=level, max_num_tokens=8192)
        try:
            run_executor(executor, prompts, 64, level)  # warm-up round
            # Every thread: the engine's ops run on its own thread, not this one.
            with profile(activities=activities, experimental_config=_ExperimentalConfig(profile_all_threads=True)) \
                    as profiler:
                started = time.perf_counter()
                tokens, seconds, _ = run_executor(executor, prompts, 64, level)
            print(f"profiled round: {tokens / seconds:.0f} tok/s, {(time.perf_counter() - started) * 1000:.0f} ms")
        finally:
            executor.shutdown()
    events = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CPU]
    print_top(events, "first 120 ms of the round", 120)
    print_top(events, "whole round", float("inf"))


if __name__ == "__main__":
    main()
