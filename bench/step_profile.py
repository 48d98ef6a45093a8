"""Where an engine iteration's time goes: the engine thread's phases, and on CUDA the GPU's kernel time.

    .venv/bin/python bench/step_profile.py --tiny --levels 1,64            # here: a tiny random model (host work only)
    bench/gpu/run_on_gpu.sh python bench/step_profile.py --device cuda --levels 1,256 [--eager]

For each level N: N greedy requests of --max-tokens each, all in flight at once, through the transformers executor
(engine on a thread of this process); after a warm-up round at the same level, one measured round. Printed per level:
tokens/s, milliseconds per iteration, the engine thread's milliseconds per iteration in each phase (schedule,
decode = inputs and launch, sample = on CUDA also the wait for the GPU, accept, prefill), and on CUDA the GPU's kernel
time per iteration (torch.profiler over the measured round) with the kernels that took most of it. GPU time near
the iteration's wall time means the GPU bounds the step; far below it, the host does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402


def tiny_model() -> torch.nn.Module:
    """Random weights, SmolLM2's vocabulary, one small layer: the forward costs little, the host work shows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=96, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=8192)
    return LlamaForCausalLM(config).eval()


def run_round(executor: TransformersExecutor, prompts: list[list[int]], max_tokens: int,
              sample: bool) -> tuple[int, float]:
    """Every prompt in flight at once, to the end; (generated tokens, seconds)."""
    settings = {"temperature": 0.8, "top_p": 0.95} if sample else {}
    begin = time.monotonic()
    open_ids = {
        executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=max_tokens, min_tokens=max_tokens,
                                           seed=seed if sample else None, **settings))
        for seed, prompt in enumerate(prompts)
    }
    tokens = 0
    while open_ids:
        for step in executor.await_steps(5.0):
            tokens += len(step.token_ids)
            if step.is_final:
                open_ids.discard(step.request_id)
    return tokens, time.monotonic() - begin


def kernel_summary(profiler: torch.profiler.profile, iterations: int, top: int) -> tuple[float, float, list[dict]]:
    """GPU milliseconds per iteration in all kernels, kernels launched per iteration, and the `top` kernels by time."""
    kernels: dict[str, list[float]] = {}
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            entry[1] += 1
    total_us = sum(entry[0] for entry in kernels.values())
    launched = sum(entry[1] for entry in kernels.values())
    ranked = sorted(kernels.items(), key=lambda item: -item[1][0])[:top]
    return total_us / 1000.0 / iterations, launched / iterations, [
        {"kernel": name[:90], "ms_per_iteration": us / 1000.0 / iterations, "calls_per_iteration": calls / iterations}
        for name, (us, calls) in ranked
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16, float32 on a CPU without bfloat16 dot products")
    parser.add_argument("--levels", default="1,64")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=48, help="tokens per prompt (distinct random ids)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model instead of the embedded SmolLM2")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (config cuda_graphs=false)")
    parser.add_argument("--sample", action="store_true",
                        help="sampled requests (temperature 0.8, top_p 0.95, each its own seed) instead of greedy")
    parser.add_argument("--attention", choices=["grouped", "sdpa"], default="grouped",
                        help="decode attention: the engine's grouped-query function (default) or transformers' SDPA")
    parser.add_argument("--fused-forward", action=argparse.BooleanOptionalAction, default=None,
                        help="forwards as embedded/fused_forward.py's pieces, compiled on CUDA, eager on CPU (default: on)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--top", type=int, default=8, help="kernels listed per level")
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from trtllm_model.embedded.model_loading import default_dtype, load_model

    dtype = args.dtype or default_dtype(args.device)
    if args.tiny:
        model = tiny_model().to(device=args.device, dtype=getattr(torch, dtype))
    else:
        model = load_model(device=args.device, dtype=dtype).model
    levels = [int(level) for level in args.levels.split(",") if level]
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    cuda = model.device.type == "cuda"
    results = []
    with torch.inference_mode():
        executor = TransformersExecutor(model, None, max_batch_size=max(levels), max_num_tokens=16384,
                                        cuda_graphs=not args.eager, fused_forward=args.fused_forward)
        engine = executor.engine
        if args.attention == "sdpa":
            model.config._attn_implementation = "sdpa"
        try:
            for level in levels:
                prompts = torch.randint(1, vocab, (level, args.prompt_len), generator=generator).tolist()
                run_round(executor, prompts, args.max_tokens, args.sample)  # warm-up: allocations, graphs of these buckets
                engine.phase_seconds.clear()
                first = engine.iteration
                if cuda:
                    activities = [torch.profiler.ProfilerActivity.CUDA]
                    with torch.profiler.profile(activities=activities) as profiler:
                        tokens, seconds = run_round(executor, prompts, args.max_tokens, args.sample)
                        torch.cuda.synchronize()
                else:
                    tokens, seconds = run_round(executor, prompts, args.max_tokens, args.sample)
                iterations = max(1, engine.iteration - first)
                row = {
                    "level": level, "tokens_per_s": tokens / seconds, "iterations": iterations,
                    "ms_per_iteration": seconds * 1000.0 / iterations,
                    "phase_ms_per_iteration": {
                        phase: value * 1000.0 / iterations for phase, value in engine.phase_seconds.items()
                    },
                }
                if cuda:
                    gpu_ms, launched, top = kernel_summary(profiler, iterations, args.top)
                    row.update(gpu_ms_per_iteration=gpu_ms, kernels_per_iteration=launched, top_kernels=top)
                results.append(row)
                phases = ", ".join(f"{phase} {ms:.2f}" for phase, ms in row["phase_ms_per_iteration"].items())
                gpu = (f", GPU kernels {row['gpu_ms_per_iteration']:.2f} ms ({row['kernels_per_iteration']:.0f} launched)"
                       if cuda else "")
                print(f"{level:>4} in flight: {row['tokens_per_s']:>9.1f} tok/s, {row['ms_per_iteration']:.2f} ms per "
                      f"iteration ({iterations}){gpu}; engine thread ms: {phases}", flush=True)
                for kernel in row.get("top_kernels", []):
                    print(f"       {kernel['ms_per_iteration']:7.3f} ms  x{kernel['calls_per_iteration']:<6.1f} "
                          f"{kernel['kernel']}")
        finally:
            executor.shutdown()
    if args.results_dir:
        path = Path(args.results_dir) / time.strftime("step-profile-%Y%m%d-%H%M%S.json", time.gmtime())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"args": vars(args), "dtype": dtype, "torch": torch.__version__,
                                    "results": results}, indent=2))
        print(f"results: {path}")


if __name__ == "__main__":
    main()
