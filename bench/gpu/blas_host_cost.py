"""Host microseconds per bf16 matmul call on a GPU, by BLAS backend (cuBLAS, cuBLASLt): the four matmul shapes of a
SmolLM2 layer at prompt-forward sizes (about 10,000-12,000 tokens), with one token count for every call or a new one
at each call, the GPU idle at each call (synchronized before it) or the calls queued back to back.

    bash bench/gpu/run_on_gpu.sh python bench/gpu/blas_host_cost.py     # or any python3 with torch on a GPU host

Written for issue 33 (2026-12-04): a prompt forward's token count (rows x queries) changes with every iteration, and
the first call of a matmul at a token count the process has not seen costs the host far more than the next ones.
"""

from __future__ import annotations

import time

import torch

SHAPES = [(960, 576), (3072, 576), (576, 1536), (576, 576)]  # (out, in): qkv, gate and up, down, output projection


def host_us_per_call(weights: dict, inputs: dict, backend: str, new_counts: bool, idle: bool, calls: int) -> None:
    torch.backends.cuda.preferred_blas_library(backend)
    host = 0.0
    torch.cuda.synchronize()
    started = time.perf_counter()
    for call in range(calls):
        tokens = 10000 + (call * 37) % 1900 if new_counts else 11000
        for (out, inner), weight in weights.items():
            x = inputs[inner][:tokens]
            if idle:
                torch.cuda.synchronize()
            before = time.perf_counter()
            if out == inner:
                torch.addmm(x, x, weight.t())  # a residual add, as inductor emits the output projection's
            else:
                torch.mm(x, weight.t())
            host += time.perf_counter() - before
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    count = calls * len(weights)
    print(f"{backend:9s} new token counts={new_counts!s:5} idle={idle!s:5}: host {host / count * 1e6:7.1f} us a call, "
          f"wall {wall / count * 1e6:7.1f} us a call", flush=True)


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name(), "default:", torch.backends.cuda.preferred_blas_library())
    weights = {shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for shape in SHAPES}
    inputs = {inner: torch.randn(12000, inner, device="cuda", dtype=torch.bfloat16) for inner in (576, 1536)}
    for backend in ("cublas", "cublaslt"):
        # The first 20 token counts of the sequence below, each seen for the first time by this backend.
        host_us_per_call(weights, inputs, backend, True, False, 20)
        for new_counts in (False, True):
            for idle in (True, False):
                host_us_per_call(weights, inputs, backend, new_counts, idle, 240)


if __name__ == "__main__":
    main()
