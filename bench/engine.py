"""Throughput of the transformers executor (in-flight batching) against plain `model.generate`.

Same prompts (chat-formatted questions of different lengths), same output length for every request (min_tokens =
max_tokens, so no request ends early), greedy, one run each:
  executor @ c   the prompts through TransformersExecutor with at most c requests in flight (a closed loop)
  sequential     model.generate on one prompt at a time
  static         one model.generate over all prompts, left-padded into one batch
  compiled       the same batch through transformers' static-cache `generate`, which compiles its forward
                 automatically on CUDA (torch.compile, "reduce-overhead"); its first call (the compile) is a warm-up,
                 timed and reported apart (default on CUDA; --compiled-static / --no-compiled-static)
Each level runs max(level, --prompts) prompts, and the static batches are measured over those same prompts.
--repeat N measures every row N times (the executor's levels and the baselines alternate run by run) and reports the
median with the spread (max - min) / median. --rounds R makes each measurement R rounds of the same work back to
back (tokens and seconds summed; default 5 on CUDA, 1 on CPU): a 256-stream round on a GPU lasts about 0.2 s, so one
stall of the host's moves a one-round figure by a third (docs/history/2026-12-05-engine-host-work-and-cpu-dtype.md, "The spread, measured longer").
Tokens/s counts generated tokens only. Run: `.venv/bin/python bench/engine.py` (about 10 minutes on 2 CPU cores);
shorter: `--max-tokens 16 --prompts 8 --levels 1,8`. On a GPU (bench/gpu/run_on_gpu.sh engine ...):
`--device cuda --levels 1,32,128,256 --prompts 8 --sequential-prompts 8 --repeat 3`.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.embedded.model_loading import default_dtype, load_model  # noqa: E402
from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.engine_wire import EngineSpec  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402
from trtllm_model.pipeline.detokenizer import chat_prompt_ids  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in simple terms for a ten year old who likes plants.",
    "hi",
    "List three primary colors and one thing that has each color.",
    "Who wrote Hamlet?",
    "Translate 'good morning, how are you today?' to French and to Spanish.",
    "What is 17 times 23?",
    "Give me a short tip for learning to cook at home on a budget.",
    "Why is the sky blue?",
    "Describe a cat in one sentence.",
    "What are the benefits of regular exercise for older adults, briefly?",
    "Name a famous painting.",
    "How do airplanes stay in the air? Keep it short, please.",
    "Suggest a name for a small bakery by the river.",
    "What is the boiling point of water at sea level in Celsius and Fahrenheit?",
]


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)]
        if i >= len(QUESTIONS):
            question += " Answer as a pirate would." * (1 + i // len(QUESTIONS))
        prompts.append(chat_prompt_ids(tokenizer, [{"role": "user", "content": question}]))
    return prompts


def run_executor(executor: TransformersExecutor, prompts: list[list[int]], max_tokens: int, concurrency: int):
    """All prompts with at most `concurrency` in flight; returns (generated tokens, wall seconds, TTFTs)."""
    queue = list(prompts)
    started, first_token, tokens, open_ids = {}, {}, 0, set()
    begin = time.monotonic()
    while queue or open_ids:
        while queue and len(open_ids) < concurrency:
            request = GenerationRequest(input_ids=queue.pop(0), max_tokens=max_tokens, min_tokens=max_tokens)
            request_id = executor.enqueue(request)
            started[request_id] = time.monotonic()
            open_ids.add(request_id)
        for step in executor.await_steps(5.0):
            if step.token_ids and step.request_id not in first_token:
                first_token[step.request_id] = time.monotonic() - started[step.request_id]
            tokens += len(step.token_ids)
            if step.is_final:
                open_ids.discard(step.request_id)
    return tokens, time.monotonic() - begin, list(first_token.values())


def run_sequential(model, prompts: list[list[int]], max_tokens: int, pad_id: int) -> tuple[int, float]:
    tokens, begin = 0, time.monotonic()
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
        tokens += out.shape[1] - len(prompt)
    _synchronize(model)
    return tokens, time.monotonic() - begin


def run_static(model, prompts: list[list[int]], max_tokens: int, pad_id: int, compiled: bool = False
               ) -> tuple[int, float]:
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    # A static cache as long as this batch needs: generate compiles its decode forward for that shape on CUDA.
    cache = {"cache_implementation": "static", "max_cache_len": width + max_tokens} if compiled else {}
    begin = time.monotonic()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        **cache,
    )
    _synchronize(model)
    return (out.shape[1] - width) * len(prompts), time.monotonic() - begin


def _synchronize(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32,
                        help="requests per measurement: at least this many, and at least the level (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--levels", default="1,8,32", help="executor concurrency levels (default 1,8,32)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", default=None, help="default: bfloat16, float32 on a CPU without bfloat16 dot products")
    parser.add_argument("--sequential-prompts", type=int, default=None,
                        help="prompts for the one-at-a-time baseline (its tokens/s does not depend on how many; "
                             "default: --prompts)")
    parser.add_argument("--skip-sequential", action="store_true", help="skip the one-at-a-time generate baseline")
    parser.add_argument("--results-dir", default=None, help="also write engine-<time>.json there")
    parser.add_argument("--eager", action="store_true",
                        help="decode steps as eager forwards, no CUDA graphs (config cuda_graphs=false)")
    parser.add_argument("--engine-process", action="store_true",
                        help="the executor's engine in a worker process of its own (config engine_process=true)")
    parser.add_argument("--overlap-steps", action=argparse.BooleanOptionalAction, default=None,
                        help="the engine's overlapped steps (default: on CUDA only)")
    parser.add_argument("--decode-steps", type=int, default=None,
                        help="the engine's decode steps an iteration (default: the device's, 4 on CUDA)")
    parser.add_argument("--fused-forward", action=argparse.BooleanOptionalAction, default=None,
                        help="forwards as embedded/fused_forward.py's pieces, compiled on CUDA, eager on CPU (default: on)")
    parser.add_argument("--repeat", type=int, default=1, help="measurements of each row; median and spread reported")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the same work in each measurement, back to back (default 5 on CUDA, 1 on CPU)")
    parser.add_argument("--compiled-static", action=argparse.BooleanOptionalAction, default=None,
                        help="also transformers' compiled static-cache generate (default: on CUDA only)")
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 5 if args.device.startswith("cuda") else 1
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat take a count of at least 1")
    compiled_static = args.compiled_static if args.compiled_static is not None else args.device.startswith("cuda")
    torch.set_num_threads(args.threads)
    levels = [int(level) for level in args.levels.split(",") if level]
    dtype = args.dtype or default_dtype(args.device)

    loaded = load_model(device=args.device, dtype=dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    all_prompts = chat_prompts(tokenizer, max([args.prompts, args.sequential_prompts or 0, *levels]))
    lengths = [len(prompt) for prompt in all_prompts]
    print(
        f"{args.device} {dtype}: prompts of {min(lengths)}-{max(lengths)} tokens, {args.max_tokens} new tokens each, "
        f"torch threads {torch.get_num_threads()}, {args.rounds} round(s) a measurement",
        flush=True,
    )

    runs: dict[str, list[tuple]] = {}  # method -> (in flight, prompts, tokens, seconds, TTFT p50 or None) per run
    with torch.inference_mode():
        warm = torch.tensor([all_prompts[0]], device=model.device)
        model.generate(warm, max_new_tokens=2, do_sample=False, pad_token_id=pad_id)
        if args.engine_process:
            spec = EngineSpec(device=args.device, dtype=dtype, torch_threads=args.threads,
                              max_batch_size=max(levels), max_num_tokens=8192, cuda_graphs=not args.eager,
                              overlap_steps=args.overlap_steps, fused_forward=args.fused_forward,
                              decode_steps=args.decode_steps)
            executor = TransformersExecutor.in_worker_process(spec)
        else:
            # A model object of its own: the engine changes its forward (embedded/model_patches.py), and the
            # generate baselines below stay transformers' own.
            engine_model = load_model(device=args.device, dtype=dtype).model
            executor = TransformersExecutor(engine_model, tokenizer, max_batch_size=max(levels), max_num_tokens=8192,
                                            cuda_graphs=not args.eager, overlap_steps=args.overlap_steps,
                                            fused_forward=args.fused_forward, decode_steps=args.decode_steps)
        counts = sorted({max(level, args.prompts) for level in levels})
        try:
            run_executor(executor, all_prompts[: max(levels)], 4, max(levels))  # warm-up (allocations, graphs)
            for _ in range(args.repeat):
                for level in levels:
                    prompts = all_prompts[: max(level, args.prompts)]
                    engine = executor.engine if executor.runner is not None else None  # None: in the worker
                    before = (engine.iteration, dict(engine.phase_seconds), _host_counters()) if engine else None
                    executor.iteration_stats()  # what came before this run
                    tokens, seconds, ttfts = _rounds(args.rounds, run_executor, executor, prompts, args.max_tokens,
                                                     level)
                    _record(runs, f"executor @ {level}", level, len(prompts), tokens, seconds, statistics.median(ttfts))
                    stats = executor.iteration_stats()
                    prefilling = sum(1 for stat in stats if stat.context_requests)
                    if engine:
                        _print_phases(engine, *before, prefilling)
                    else:
                        print(f"    {len(stats)} iterations in the worker ({prefilling} prefilling)", flush=True)
        finally:
            executor.shutdown()  # its KV pool is most of the free GPU memory: gone before the baselines run
        compile_s = {}
        if compiled_static:  # the compile, once per batch shape, before anything is measured
            for count in counts:
                _, compile_s[count] = run_static(model, all_prompts[:count], args.max_tokens, pad_id, compiled=True)
                print(f"  compiled static generate, batch of {count}: first call (compile) {compile_s[count]:.1f} s",
                      flush=True)
        for _ in range(args.repeat):
            if not args.skip_sequential:
                prompts = all_prompts[: args.sequential_prompts or args.prompts]
                tokens, seconds = _rounds(args.rounds, run_sequential, model, prompts, args.max_tokens, pad_id)
                _record(runs, "generate, sequential", 1, len(prompts), tokens, seconds, None)
            for count in counts:
                tokens, seconds = _rounds(args.rounds, run_static, model, all_prompts[:count], args.max_tokens, pad_id)
                _record(runs, f"generate, static batch of {count}", count, count, tokens, seconds, None)
                if compiled_static:
                    tokens, seconds = _rounds(args.rounds, run_static, model, all_prompts[:count], args.max_tokens,
                                              pad_id, compiled=True)
                    _record(runs, f"generate, compiled static batch of {count}", count, count, tokens, seconds, None)
    rows = [_row(method, measured) for method, measured in runs.items()]

    rate = {row["method"]: row["tokens_per_s"] for row in rows}
    sequential = rate.get("generate, sequential")
    print()
    print(
        f"| {'method':<38} | {'in flight':>9} | {'prompts':>7} | {'runs':>4} | {'tok/s (median)':>14} | "
        f"{'spread':>6} | {'TTFT p50 s':>10} | {'vs sequential':>13} | {'vs static':>9} | {'vs compiled static':>18} |"
    )
    print(f"|{'-' * 40}|{'-' * 11}|{'-' * 9}|{'-' * 6}|{'-' * 16}|{'-' * 8}|{'-' * 12}|{'-' * 15}|{'-' * 11}|{'-' * 20}|")
    for row in rows:
        static = rate.get(f"generate, static batch of {row['prompts']}")
        compiled = rate.get(f"generate, compiled static batch of {row['prompts']}")
        row["vs_sequential"] = row["tokens_per_s"] / sequential if sequential else None
        row["vs_static_same_prompts"] = row["tokens_per_s"] / static if static else None
        row["vs_compiled_static_same_prompts"] = row["tokens_per_s"] / compiled if compiled else None
        row["compile_s"] = compile_s.get(row["prompts"]) if "compiled" in row["method"] else None
        ttft = f"{row['ttft_p50_s']:.3f}" if row["ttft_p50_s"] is not None else "-"
        print(
            f"| {row['method']:<38} | {row['in_flight']:>9} | {row['prompts']:>7} | {row['runs']:>4} | "
            f"{row['tokens_per_s']:>14.1f} | {row['spread']:>6.1%} | {ttft:>10} | {_ratio(row['vs_sequential']):>13} | "
            f"{_ratio(row['vs_static_same_prompts']):>9} | {_ratio(row['vs_compiled_static_same_prompts']):>18} |"
        )
    if args.results_dir:
        path = Path(args.results_dir) / time.strftime("engine-%Y%m%d-%H%M%S.json", time.gmtime())
        path.parent.mkdir(parents=True, exist_ok=True)
        device_name = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu"
        path.write_text(json.dumps({"args": vars(args), "dtype": dtype, "device_name": device_name,
                                    "torch": torch.__version__, "rows": rows}, indent=2))
        print(f"results: {path}")


def _rounds(rounds: int, run, *args, **kwargs) -> tuple:
    """`run(*args, **kwargs)` `rounds` times back to back: its tokens and seconds summed, its TTFTs (if any) joined."""
    results = [run(*args, **kwargs) for _ in range(rounds)]
    summed = (sum(result[0] for result in results), sum(result[1] for result in results))
    return (*summed, [ttft for result in results for ttft in result[2]]) if len(results[0]) > 2 else summed


def _record(runs: dict[str, list[tuple]], method: str, in_flight: int, prompts: int, tokens: int, seconds: float,
            ttft: float | None) -> None:
    print(f"  done: {method} ({prompts} prompts): {tokens / seconds:.1f} tok/s", flush=True)
    runs.setdefault(method, []).append((in_flight, prompts, tokens, seconds, ttft))


def _host_counters() -> dict[str, int]:
    """What can stall the host between a run's iterations: the collector's passes and the CUDA allocator's retries
    (a failed cudaMalloc that frees the cache, synchronizing, and tries again)."""
    counters = {f"gc gen{generation}": stats["collections"] for generation, stats in enumerate(gc.get_stats())}
    if torch.cuda.is_initialized():
        counters["alloc retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    return counters


def _print_phases(engine, iteration_before: int, seconds_before: dict[str, float], counters_before: dict[str, int],
                  prefilling: int) -> None:
    """The engine thread's iterations in the last run (and how many prefilled), its milliseconds per iteration in each
    phase, and the host counters that moved."""
    iterations = max(1, engine.iteration - iteration_before)
    phases = {name: (total - seconds_before.get(name, 0.0)) * 1000 / iterations
              for name, total in engine.phase_seconds.items()}
    moved = {name: count - counters_before.get(name, 0) for name, count in _host_counters().items()}
    print(f"    {iterations} iterations ({prefilling} prefilling), ms each: "
          + ", ".join(f"{name} {ms:.2f}" for name, ms in phases.items())
          + "; " + ", ".join(f"{name} {count}" for name, count in moved.items()), flush=True)


def _row(method: str, measured: list[tuple]) -> dict:
    """One table row: the median of the runs' tokens/s, their spread (max - min) / median, and each run's figure."""
    in_flight, prompts = measured[0][:2]
    rates = [tokens / seconds for _, _, tokens, seconds, _ in measured]
    median = statistics.median(rates)
    ttfts = [ttft for *_, ttft in measured if ttft is not None]
    return {"method": method, "in_flight": in_flight, "prompts": prompts, "runs": len(measured),
            "tokens_per_s": median, "spread": (max(rates) - min(rates)) / median, "tokens_per_s_runs": rates,
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None}


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


if __name__ == "__main__":
    main()
