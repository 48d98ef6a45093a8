"""Which host-side operation of an engine step waits for the GPU (CUDA only).

    python bench/gpu/sync_probe.py

Each operation runs right after ~0.3 s of queued matmuls; one that returns only after them waits for the device
(the overlapped steps of embedded/engine.py must contain none). Then the engine itself on a tiny random model: its
launches against its iterations, and the engine thread's time per phase.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.embedded.sampling import SamplingParams, SamplingState, ban_tokens, sample_on_device  # noqa: E402
from trtllm_model.embedded.transfers import to_device  # noqa: E402

device = torch.device("cuda")
big = torch.randn(8192, 8192, device=device)


def probe(name: str, operation) -> None:
    torch.cuda.synchronize()
    for _ in range(16):
        big @ big
    began = time.perf_counter()
    operation()
    took = time.perf_counter() - began
    torch.cuda.synchronize()
    waited = time.perf_counter() - began
    print(f"{name:48s} {took * 1e3:8.2f} ms of {waited * 1e3:8.2f} ms {'WAITS' if took > 0.5 * waited else ''}",
          flush=True)


logits = torch.randn(256, 49152, device=device)
fed = torch.arange(256, device=device)
static_ids = torch.zeros(512, 1, dtype=torch.long, device=device)
pinned = torch.empty(512, dtype=torch.long, pin_memory=True)
greedy = [SamplingState(SamplingParams(greedy=True, min_tokens=64), None, [1], {}, 3, 2) for _ in range(256)]
sampled = [SamplingState(SamplingParams(greedy=False, temperature=0.8, top_p=0.95), random.Random(i), [1], {}, 3, 2)
           for i in range(256)]
probe("torch.tensor(list, device=cuda)", lambda: torch.tensor([1, 2, 3], device=device))
probe("to_device(list)", lambda: to_device([[0, 1], [2, 3]], device, torch.long))
probe("logits[i, j] = -inf (device index)", lambda: logits.__setitem__(
    tuple(to_device([[0, 1], [2, 3]], device, torch.long)), float("-inf")))
probe("ban_tokens (early end ids), 256 rows", lambda: ban_tokens(logits, [(row, 2) for row in range(256)]))
probe("sample_on_device, greedy 256", lambda: sample_on_device(logits, greedy))
probe("sample_on_device, top_p 256", lambda: sample_on_device(logits, sampled))
probe("argmax", lambda: logits.argmax(-1))
probe("D2H copy_ into pinned, non_blocking", lambda: pinned[:256].copy_(fed, non_blocking=True))
probe("Event().record()", lambda: torch.cuda.Event().record())
probe("numpy -> pin_memory -> static copy_", lambda: static_ids.copy_(
    torch.from_numpy(np.zeros((512, 1), dtype=np.int64)).pin_memory(), non_blocking=True))
probe("numpy -> static copy_ (pageable)", lambda: static_ids.copy_(
    torch.from_numpy(np.zeros((512, 1), dtype=np.int64)), non_blocking=True))
probe("feed: ids[to_device(rows), 0] = fed[to_device(src)]", lambda: static_ids.__setitem__(
    (to_device(list(range(256)), device, torch.long), 0), fed[to_device(list(range(256)), device, torch.long)]))
probe("logits[:256].clone()", lambda: logits[:256].clone())
probe("memory_allocated", lambda: torch.cuda.memory_allocated(device))

# The engine on a tiny random model (graphs, overlapped steps): launches against iterations, phases.
from step_profile import run_round, tiny_model  # noqa: E402

from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402

for overlap in (True, False):
    executor = TransformersExecutor(tiny_model().to(device), None, max_batch_size=256, overlap_steps=overlap,
                                    kv_cache_memory_bytes=1 << 30)
    prompts = [[1 + i, 200 + i, 300] * 16 for i in range(256)]
    for level in (1, 256):
        run_round(executor, prompts[:level], 64, False)
        engine = executor.engine
        before = dict(engine.phase_seconds), engine.iteration, engine.launcher.launches
        tokens, seconds = run_round(executor, prompts[:level], 64, False)
        iterations = engine.iteration - before[1]
        phases = {k: f"{(v - before[0].get(k, 0.0)) / iterations * 1e3:.2f}" for k, v in engine.phase_seconds.items()}
        print(f"tiny model, overlap {overlap}, {level} in flight: {tokens / seconds:,.0f} tok/s, "
              f"{seconds / iterations * 1e3:.2f} ms/iteration, {engine.launcher.launches - before[2]} launches of "
              f"{iterations} iterations, ms/iteration {phases}", flush=True)
    executor.shutdown()
