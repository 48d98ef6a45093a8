"""Why float32 on this CPU gives a prompt served from the prefix cache other log probs than the same prompt served
cold, and what a fix would cost (issue 33, 2026-12-06).

1. Row invariance: for each of SmolLM2's matmul shapes, the row counts M (1..512) at which a row's result differs
   bitwise from the same row computed in a 512-row matmul: torch's float32 `F.linear` (MKL sgemm), MKL's packed
   GEMM, oneDNN's float32 linear (`torch.ops.mkldnn._linear_pointwise`), and bfloat16 `F.linear` (oneDNN).
2. Cost: one decode step's layer matmuls (30 layers x qkv, o, gate/up, down) at M rows, 2 threads, each path;
   oneDNN's float32 one at max(M, 2) rows (its M = 1 is not row-invariant).
3. End to end (`--served`): the embedded executor in float32, one 64-token prompt three times (cold, then warm from
   the prefix cache), 8 greedy tokens with log probs: MKL as is, then every float32 linear through oneDNN.

Run: .venv/bin/python bench/results/cpu-gemm-row-invariance-20261206.py [--served]
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152))  # (K, N): qkv, o, gate/up, down, head


def one_dnn(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(a, weight, None, "none", [], "")


def mismatching_rows(linear, x: torch.Tensor, counts) -> list[int]:
    reference = linear(x[:512])
    return [m for m in counts if not torch.equal(linear(x[512 - m : 512]), reference[512 - m :])]


def row_invariance() -> None:
    print("== 1. row counts M whose rows differ from the same rows in a 512-row matmul")
    torch.manual_seed(0)
    for k, n in SHAPES:
        x, weight = torch.randn(512, k), torch.randn(n, k) * 0.05
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, 16)
        counts = range(1, 513) if n < 10_000 else (1, 2, 3, 4, 5, 8, 15, 16, 17, 33, 64, 100, 257)
        weight_bf16 = weight.bfloat16()
        paths = {
            "float32 F.linear (MKL)": lambda a, w=weight: F.linear(a, w),
            "float32 MKL packed": lambda a, p=packed, w=weight: torch.ops.mkl._mkl_linear(a, p, w, None, 16),
            "float32 oneDNN": lambda a, w=weight: one_dnn(a, w),
            "bfloat16 F.linear (oneDNN)": lambda a, w=weight_bf16: F.linear(a, w),
        }
        for name, linear in paths.items():
            source = x.bfloat16() if name.startswith("bfloat16") else x
            bad = mismatching_rows(linear, source, counts)
            print(f"  [M, {k}] x [{k}, {n}] {name:28s}: {len(bad):3d} of {len(counts)} differ; largest M {max(bad, default='-')}")


def timed(function, *args, calls: int = 200) -> float:
    function(*args)
    start = time.perf_counter()
    for _ in range(calls):
        function(*args)
    return (time.perf_counter() - start) / calls * 1e3


def step_cost() -> None:
    print("== 2. one decode step's layer matmuls (30 layers), ms, 2 threads")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    for m in (1, 2, 4, 16, 32, 128):
        totals = {"float32 MKL": 0.0, "float32 oneDNN at max(M, 2) rows": 0.0, "bfloat16": 0.0}
        for k, n in SHAPES[:4]:
            x, weight = torch.randn(128, k), torch.randn(n, k) * 0.05
            a, a2, ab, wb = x[:m].contiguous(), x[: max(m, 2)].contiguous(), x[:m].bfloat16(), weight.bfloat16()
            totals["float32 MKL"] += timed(F.linear, a, weight)
            totals["float32 oneDNN at max(M, 2) rows"] += timed(one_dnn, a2, weight)
            totals["bfloat16"] += timed(F.linear, ab, wb)
        print(f"  M = {m:3d}: " + ", ".join(f"{name} {total * 30:.1f}" for name, total in totals.items()))


def served() -> None:
    sys.path[:0] = [".", "tests"]
    from test_transformers_executor import greedy, run

    from trtllm_model.embedded.model_loading import load_model
    from trtllm_model.executors.transformers_executor import TransformersExecutor

    print("== 3. served in float32: one 64-token prompt three times (cold, warm, warm)")
    loaded = load_model(dtype="float32")
    prompt = loaded.tokenizer("The capital of France is Paris. " * 9)["input_ids"]
    mkl_linear = F.linear

    def through_one_dnn(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if a.dtype != torch.float32 or bias is not None:
            return mkl_linear(a, weight, bias)
        flat = a.reshape(-1, a.shape[-1])
        rows = flat.shape[0]
        out = one_dnn(flat.expand(2, -1) if rows == 1 else flat, weight)[:rows]
        return out.reshape(*a.shape[:-1], weight.shape[0])

    for name, linear in (("MKL (as served)", mkl_linear), ("oneDNN for every float32 linear", through_one_dnn)):
        F.linear = linear
        executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, max_num_tokens=1024)
        try:
            runs = []
            for _ in range(3):
                start = time.perf_counter()
                (result,) = run(executor, [greedy(prompt, max_tokens=8, return_log_probs=True)])
                runs.append((result.cum_log_prob, time.perf_counter() - start))
        finally:
            executor.shutdown()
            F.linear = mkl_linear
        equal = all(cum == runs[0][0] for cum, _ in runs)
        print(f"  {name}: {len(prompt)} tokens, bit-equal {equal}: "
              + ", ".join(f"cum {cum!r} in {seconds:.2f} s" for cum, seconds in runs))


if __name__ == "__main__":
    print(torch.__version__, torch.backends.mkldnn.is_available())
    row_invariance()
    step_cost()
    if "--served" in sys.argv:
        served()
