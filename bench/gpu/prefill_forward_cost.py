"""What one prompt forward costs the host and the GPU, at the shapes of bench/engine.py's chat prompts at 256
streams, for variants of embedded/fused_forward.py: host ms (the call to its return), wall ms (the call to a
synchronize, the GPU idle before), GPU ms (the call queued behind a sleep kernel, so its launches do not pace it).

    bash bench/gpu/run_on_gpu.sh python bench/gpu/prefill_forward_cost.py real     # SmolLM2 on the GPU
    .venv/bin/python bench/gpu/prefill_forward_cost.py tiny                         # a dry run on the CPU

Variants: the compiled pieces (main), the same uncompiled, compiled with inductor's C++ wrapper (CUDA only),
attention and pieces compiled as one function a layer (the KV pool written inside it), the whole forward compiled.
Issue 33's run of 2026-12-04 (docs/history/2026-12-04-engine-on-the-h200.md) ran this script as `.gpu/prefill_micro.py` (the same code,
reformatted since; the per-layer variant now runs FusedForward's own loop and _attend, not copies of them).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from step_profile import tiny_model  # noqa: E402

from trtllm_model.embedded import fused_forward  # noqa: E402
from trtllm_model.embedded.kv_cache import KvBlockPool, StepInputs  # noqa: E402
from trtllm_model.embedded.model_loading import load_model  # noqa: E402

BLOCK_SIZE = 16
# The prefill groups of bench/engine.py's 256 chat prompts (rows x queries), and the first three merged.
SHAPES = [(69, 88), (61, 57), (1, 30), (131, 88), (78, 121), (22, 127)]


class LayerCompiled(fused_forward.FusedForward):
    """A layer's attention and the pieces after it as one compiled function: FusedForward's own loop, its
    `_attend` deferred into `_between` (the last layer's attention stays eager, before `_last`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        layer = torch.compile(self._layer_eager, fullgraph=True)
        self._between = lambda hidden, deferred, *after: layer(hidden, *deferred, *after)

    def _attend(self, pool, index, query, key, value, slots, flat_tables, mask, rows):
        if index == len(self.layers) - 1:
            return super()._attend(pool, index, query, key, value, slots, flat_tables, mask, rows)
        return pool.keys[index], pool.values[index], query, key, value, slots, flat_tables, mask

    def _layer_eager(self, hidden, keys, values, query, key, value, slots, flat_tables, mask, *after):
        layer_pool = _OneLayer([keys], [values])  # the pool's layer, as _attend reads a pool
        attention = super()._attend(layer_pool, 0, query, key, value, slots, flat_tables, mask, mask.shape[0])
        return self._between_attentions(hidden, attention, *after)


class _OneLayer:
    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys, self.values = keys, values


def variants(model: torch.nn.Module, cuda: bool):
    yield "pieces (main)", fused_forward.FusedForward(model)
    yield "eager pieces", fused_forward.FusedForward(model, compile=False)
    if cuda:
        forward = fused_forward.FusedForward(model, compile=False)
        options = {"cpp_wrapper": True}
        forward._first, forward._between, forward._last = (
            torch.compile(piece, fullgraph=True, options=options)
            for piece in (forward._first, forward._between, forward._last))
        yield "pieces cpp_wrapper", forward
    yield "layer compiled", LayerCompiled(model)
    forward = fused_forward.FusedForward(model)
    yield "whole forward compiled", torch.compile(lambda inputs, pool: forward(inputs, pool), dynamic=True)


def main() -> None:
    torch.set_num_threads(4)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if sys.argv[1] == "tiny":
        model = tiny_model().to(device=device, dtype=dtype)
    else:
        model = load_model(device=str(device), dtype=str(dtype).split(".")[1]).model
    config = model.config
    kv_heads, head_dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    # As large as a serving pool on the GPU, so that a copy of a whole pool layer would show in the GPU time.
    pool = KvBlockPool(config.num_hidden_layers, 65536 if cuda else 4096, BLOCK_SIZE, kv_heads, head_dim, dtype,
                       device)

    def inputs(rows: int, queries: int) -> StepInputs:
        width = -(-queries // BLOCK_SIZE)
        ids = torch.randint(1, config.vocab_size, (rows, queries))
        positions = torch.arange(queries).repeat(rows, 1)
        tables = (1 + torch.arange(rows * width)).view(rows, width)
        slots = (torch.gather(tables, 1, positions // BLOCK_SIZE) * BLOCK_SIZE + positions % BLOCK_SIZE).reshape(-1)
        return StepInputs(*(tensor.to(device) for tensor in (ids, positions, slots, tables)))

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize()

    with torch.inference_mode():
        for name, forward in variants(model, cuda):
            started = time.perf_counter()
            try:
                for shape in ((1, 2), (1, 3), (2, 2), *SHAPES):
                    forward([inputs(*shape)], pool)
                synchronize()
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile is reported, the next runs
                print(f"{name}: failed {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            print(f"{name}: warm-up {time.perf_counter() - started:.1f} s", flush=True)
            for shape in SHAPES:
                step = inputs(*shape)
                host, wall, gpu = [], [], []
                for _ in range(5):
                    synchronize()
                    begin = time.perf_counter()
                    forward([step], pool)
                    returned = time.perf_counter()
                    synchronize()
                    host.append((returned - begin) * 1000)
                    wall.append((time.perf_counter() - begin) * 1000)
                    if cuda:
                        torch.cuda._sleep(int(2e8))
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        forward([step], pool)
                        end.record()
                        torch.cuda.synchronize()
                        gpu.append(start.elapsed_time(end))
                median = statistics.median
                line = f"   {shape[0]:>3} x {shape[1]:>3}: host {median(host):6.2f} ms, wall {median(wall):6.2f} ms"
                print(line + (f", GPU {median(gpu):6.2f} ms" if gpu else ""), flush=True)


if __name__ == "__main__":
    main()
