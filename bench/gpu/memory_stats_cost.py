"""Host cost of reading the GPU memory in use, as `Engine._record_stats` does every iteration (for `gpu_mem_bytes`),
against `torch.cuda.memory_allocated`, on a CUDA host with SmolLM2 loaded and one forward of 256 x 64 tokens run:

    bash bench/gpu/run_on_gpu.sh python bench/gpu/memory_stats_cost.py

Prints microseconds a call, 5 rounds of 2,000 calls each.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from trtllm_model.embedded.model_loading import load_model  # noqa: E402


def main() -> None:
    model = load_model(device="cuda", dtype="bfloat16").model
    device = next(model.parameters()).device
    with torch.inference_mode():
        model(torch.randint(0, 1000, (256, 64), device=device))
    torch.cuda.synchronize()
    reads = {
        "memory_stats_as_nested_dict": lambda: torch.cuda.memory_stats_as_nested_dict(device)["allocated_bytes"]["all"][
            "current"],
        "memory_allocated": lambda: torch.cuda.memory_allocated(device),
    }
    for name, read in reads.items():
        for _ in range(200):
            read()
        rounds = []
        for _ in range(5):
            begin = time.perf_counter()
            for _ in range(2000):
                read()
            rounds.append((time.perf_counter() - begin) / 2000 * 1e6)
        print(f"{name}: us a call, 5 rounds of 2000: " + ", ".join(f"{r:.1f}" for r in rounds), flush=True)


if __name__ == "__main__":
    main()
