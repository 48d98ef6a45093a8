"""The whole path: text streams into `ensemble` through tritonserver, against the same engine called in-process.

    .venv/bin/python bench/e2e.py --device cpu --loads 2 --max-tokens 8 --window 5     # a short check here
    .venv/bin/python bench/e2e.py --device cpu --tiny-model --loads 8 32 --engine-process true   # the serving path's cost
    bench/gpu/run_on_gpu.sh e2e --device cuda --loads 64 256                           # on a GPU host

For each load N (streams in flight) and the same chat prompts, greedy, every request exactly --max-tokens long
(min_tokens = max_tokens):
  in process   TransformersExecutor in a process of its own, N requests kept in flight (a closed loop): generated tokens/s
               in a --window-second window after --warmup seconds, time to first token;
  through Triton  one tritonserver with the transformers executor (same device, dtype, limits), N gRPC streams
               (split over --client-procs processes) each sending one `ensemble` request after another:
               delivered tokens/s in the same window (num_output_tokens of each response), time to first token,
               gaps between a request's responses, tokens per response, CPU of the server process tree.
The ratio delivered (Triton) / generated (in process) is the serving layer's cost on a real engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from array import array
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(ROOT))

from engine import QUESTIONS  # noqa: E402

RESULTS = BENCH_DIR / "results"


def questions(count: int) -> list[str]:
    """The same question mix as bench/engine.py, made distinct so no two requests share a prompt."""
    return [f"{QUESTIONS[i % len(QUESTIONS)]} (question {i})" for i in range(count)]


def percentile(values, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))]


# -- in process ----------------------------------------------------------------------------------------------------
def in_process(args, loads: list[int]) -> list[dict]:
    from trtllm_model.embedded.model_loading import default_dtype, load_model
    from trtllm_model.executor_interface import GenerationRequest
    from trtllm_model.executors.engine_wire import EngineSpec
    from trtllm_model.executors.transformers_executor import TransformersExecutor
    from trtllm_model.pipeline.detokenizer import chat_prompt_ids

    dtype = args.dtype or default_dtype(args.device)
    if args.engine_process == "true":  # the same worker process the server runs
        spec = EngineSpec(model_dir=args.model_dir, device=args.device, dtype=dtype, max_batch_size=max(loads),
                          max_num_tokens=args.max_num_tokens)
        executor = TransformersExecutor.in_worker_process(spec)
        loaded = None
    else:
        loaded = load_model(model_dir=args.model_dir, device=args.device, dtype=dtype)
        executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=max(loads),
                                        max_num_tokens=args.max_num_tokens)
    prompts = [chat_prompt_ids(executor.tokenizer(), [{"role": "user", "content": q}]) for q in questions(args.prompts)]
    points = []
    try:
        for load in loads:
            points.append(_closed_loop(executor, prompts, load, args, GenerationRequest))
    finally:
        executor.shutdown()
    return points


def in_process_apart(args, loads: list[int]) -> list[dict]:
    """`in_process` in a process of its own, so that the server started next finds the GPU as this one found it:
    the engine's KV pool takes a share of the memory free at its start, and an engine on a thread of this process
    kept its 77 GiB past `shutdown` on an H100 (the server's engine then failed to start, out of memory)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(in_process, args, loads).result()


def _closed_loop(executor, prompts: list[list[int]], load: int, args, request_type) -> dict:
    """`load` requests kept in flight for warmup + window seconds; tokens generated inside the window."""
    sent: dict[int, float] = {}
    ttft, tokens, submitted = array("d"), 0, 0

    def submit() -> int:
        nonlocal submitted
        prompt = prompts[submitted % len(prompts)]
        submitted += 1
        request = request_type(input_ids=prompt, max_tokens=args.max_tokens, min_tokens=args.max_tokens)
        request_id = executor.enqueue(request)
        sent[request_id] = time.monotonic()
        return request_id

    start = time.monotonic()
    w0, w1 = start + args.warmup, start + args.warmup + args.window
    # Lockstep (all start together, so all end and restart in the same step: a step either decodes or prefills)
    # or staggered (starts spread over one request's steps, so requests keep joining a running batch every step,
    # as the streams through Triton do).
    for _ in range(1 if args.stagger else load):
        submit()
    open_ids, seen_first = set(sent), set()
    waits = 0
    while time.monotonic() < w1:
        waits += 1
        while args.stagger and submitted < load and waits * load >= submitted * args.max_tokens:
            open_ids.add(submit())
        for step in executor.await_steps(1.0):
            now = time.monotonic()
            if step.token_ids and step.request_id not in seen_first:
                seen_first.add(step.request_id)
                if w0 <= sent[step.request_id] < w1:
                    ttft.append(now - sent[step.request_id])
            if w0 <= now < w1:
                tokens += len(step.token_ids)
            if step.is_final:
                open_ids.discard(step.request_id)
                open_ids.add(submit())
    for request_id in open_ids:
        executor.cancel(request_id)
    deadline = time.monotonic() + 60
    while open_ids and time.monotonic() < deadline:
        for step in executor.await_steps(0.5):
            if step.is_final:
                open_ids.discard(step.request_id)
    point = {"load_streams": load, "staggered": args.stagger, "generated_tokens_per_s": tokens / args.window,
             "ttft_p50_ms": _ms(percentile(ttft, 50)), "ttft_p99_ms": _ms(percentile(ttft, 99))}
    print(f"  in process  load {load:4d}{' staggered' if args.stagger else ''}: "
          f"{point['generated_tokens_per_s']:8.0f} tok/s  "
          f"TTFT p50 {_fmt(point['ttft_p50_ms'])} ms", flush=True)
    return point


# -- through Triton ------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    url: str
    streams: int
    first_question: int
    questions: list[str]
    max_tokens: int
    start: float
    w0: float
    w1: float


@dataclass
class Result:
    tokens: int = 0
    responses: int = 0
    requests_done: int = 0
    ttft: array = field(default_factory=lambda: array("d"))
    gaps: array = field(default_factory=lambda: array("d"))  # between consecutive responses of one request
    tokens_per_gap: array = field(default_factory=lambda: array("d"))
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0


def _request(model: str, request_id: str, text: str, max_tokens: int):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    encoded = text.encode()
    for name, datatype, raw in (
        ("text_input", "BYTES", len(encoded).to_bytes(4, "little") + encoded),
        ("max_tokens", "INT32", max_tokens.to_bytes(4, "little")),
        ("min_tokens", "INT32", max_tokens.to_bytes(4, "little")),
        ("stream", "BOOL", b"\x01"),
        ("apply_chat_template", "BOOL", b"\x01"),
        ("return_num_output_tokens", "BOOL", b"\x01"),
    ):
        tensor = request.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend([1, 1])
        request.raw_input_contents.append(raw)
    return request


async def _stream(stub, plan: Plan, index: int, result: Result) -> None:
    import grpc

    call = stub.ModelStreamInfer()
    await asyncio.sleep(max(0.0, plan.start - time.monotonic()))
    number = 0
    try:
        while time.monotonic() < plan.w1:
            text = plan.questions[(plan.first_question + index + number * 997) % len(plan.questions)]
            sent = time.monotonic()
            await call.write(_request("ensemble", f"s{index}-{number}", text, plan.max_tokens))
            number += 1
            count, last = 0, 0.0
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    raise ConnectionError("stream ended early")
                if message.error_message:
                    raise RuntimeError(message.error_message)
                now = time.monotonic()
                response = message.infer_response
                total = count
                for i, output in enumerate(response.outputs):
                    if output.name == "num_output_tokens":
                        total = int.from_bytes(response.raw_output_contents[i][:4], "little")
                new = total - count
                if new > 0:
                    if count == 0 and plan.w0 <= sent < plan.w1:
                        result.ttft.append(now - sent)
                    if plan.w0 <= now < plan.w1:
                        result.tokens += new
                        result.responses += 1
                        if count:
                            result.gaps.append(now - last)
                            result.tokens_per_gap.append(new)
                    count, last = total, now
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
            if count != plan.max_tokens:
                result.errors.append(f"request s{index}-{number - 1}: {count} tokens, expected {plan.max_tokens}")
            if plan.w0 <= now < plan.w1:  # finished inside the window, as the tokens are counted
                result.requests_done += 1
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 - one bad stream is reported, not raised
        result.errors.append(f"stream {index}: {type(exc).__name__}: {exc}")
    finally:
        call.cancel()


async def _run(plan: Plan) -> Result:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    result = Result()
    channels = [grpc.aio.insecure_channel(plan.url, options=[("grpc.channel_id", i)]) for i in range(4)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
    tasks = [asyncio.ensure_future(_stream(stubs[i % 4], plan, i, result)) for i in range(plan.streams)]
    await asyncio.sleep(max(0.0, plan.w0 - time.monotonic()))
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(max(0.0, plan.w1 - time.monotonic()))
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    result.cpu_s = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    return result


def run_worker(plan: Plan) -> Result:
    return asyncio.run(_run(plan))


def through_triton(args, loads: list[int], workdir: Path) -> list[dict]:
    import psutil
    import serving
    from conftest import start_server
    from serving import start_profile, tree_cpu_s, wait_quiet
    from ttft_split import describe, gauges, mean_gauges, snapshot, split

    serving.RESULTS = RESULTS

    parameters = {"device": args.device, "max_batch_size": str(max(loads)), "max_num_tokens": str(args.max_num_tokens),
                  **dict(item.split("=", 1) for item in args.param)}
    if args.dtype:
        parameters["dtype"] = args.dtype
    if args.model_dir:
        parameters["model_dir"] = args.model_dir
    if args.engine_process:
        parameters["engine_process"] = args.engine_process
    if "gpu_device_ids" in parameters:  # each instance's device comes from its group, not one `device` for all
        del parameters["device"]
    one = "instance_group [ { count: 1, kind: KIND_CPU } ]"
    edits = {one: one.replace("count: 1", f"count: {args.instances_used}")} if args.instances_used > 1 else None
    server = start_server(workdir, executor="transformers", parameters=parameters, ready_timeout_s=600,
                          config_edits=edits)
    texts = questions(args.prompts)
    points = []
    try:
        root = psutil.Process(server.process.pid)
        with ProcessPoolExecutor(max_workers=args.client_procs, mp_context=get_context("spawn")) as pool:
            list(pool.map(time.sleep, [0.5] * args.client_procs))
            for load in loads:
                procs = max(1, min(args.client_procs, load))
                start = time.monotonic() + 1.5
                w0, w1 = start + args.warmup, start + args.warmup + args.window
                plans = [Plan(server.grpc_url, load // procs + (1 if p < load % procs else 0), p * 1000, texts,
                              args.max_tokens, start, w0, w1) for p in range(procs)]
                futures = [pool.submit(run_worker, plan) for plan in plans]
                time.sleep(max(0.0, w0 - time.monotonic()))
                profile = start_profile(root, f"e2e-{load}", min(args.profile_s, args.window)) if args.profile_s else None
                cpu0, counted0, t0 = tree_cpu_s(root), snapshot(server.http_url, server.metrics_url), time.monotonic()
                held = []
                while time.monotonic() < w1 - 0.6:  # where the requests are, twice a second
                    time.sleep(0.5)
                    held.append(gauges(server.metrics_url))
                time.sleep(max(0.0, w1 - time.monotonic()))
                cpu1, counted1, t1 = tree_cpu_s(root), snapshot(server.http_url, server.metrics_url), time.monotonic()
                results = [future.result(timeout=args.warmup + args.window + 300) for future in futures]
                if profile is not None:
                    profile.wait(timeout=60)
                wait_quiet(root)
                gaps = [g for r in results for g in r.gaps]
                per_token = [g / n for r in results for g, n in zip(r.gaps, r.tokens_per_gap)]
                ttft = [t for r in results for t in r.ttft]
                tokens = sum(r.tokens for r in results)
                responses = sum(r.responses for r in results)
                errors = [e for r in results for e in r.errors]
                point = {
                    "load_streams": load,
                    "delivered_tokens_per_s": tokens / args.window,
                    "responses_per_s": responses / args.window,
                    "tokens_per_response": tokens / responses if responses else None,
                    "ttft_p50_ms": _ms(percentile(ttft, 50)), "ttft_p99_ms": _ms(percentile(ttft, 99)),
                    "gap_p50_ms": _ms(percentile(gaps, 50)), "gap_p99_ms": _ms(percentile(gaps, 99)),
                    "gap_per_token_p50_ms": _ms(percentile(per_token, 50)),
                    "gap_per_token_p99_ms": _ms(percentile(per_token, 99)),
                    "server_cpu_cores": (cpu1 - cpu0) / args.window,
                    "client_cpu_cores_total": sum(r.cpu_s for r in results) / args.window,
                    "requests_done": sum(r.requests_done for r in results),
                    "server_ttft_split": split(counted0, counted1, t1 - t0),
                    "server_requests_held": mean_gauges(held),
                    "error_count": len(errors), "errors": errors[:5],
                }
                print(f"  via Triton  load {load:4d}: {point['delivered_tokens_per_s']:8.0f} tok/s  TTFT p50 "
                      f"{_fmt(point['ttft_p50_ms'])} ms  gap p50/p99 {_fmt(point['gap_p50_ms'])}/"
                      f"{_fmt(point['gap_p99_ms'])} ms  tok/response {_fmt(point['tokens_per_response'], 2)}  "
                      f"server CPU {point['server_cpu_cores']:.2f}  errors {len(errors)}", flush=True)
                print(f"    in the server: {describe(point['server_ttft_split'], point['server_requests_held'])}", flush=True)
                for error in errors[:3]:
                    print(f"    error: {error}", flush=True)
                points.append(point)
    finally:
        server.stop()
    return points


def _ms(value):
    return None if value is None else 1000.0 * value


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> int:
    global RESULTS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=512, help="distinct prompts cycled through")
    parser.add_argument("--max-num-tokens", type=int, default=8192)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16, float32 on a CPU without bfloat16 dot products")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config.pbtxt parameter of the served model (e.g. sender_threads=8)")
    parser.add_argument("--profile-s", type=float, default=0.0, help="py-spy the served model this long at each load")
    parser.add_argument("--instances", type=int, default=None,
                        help="instances of tensorrt_llm (with --param gpu_device_ids=0;1: one per GPU); default: what "
                             "`trtllm-triton serve` chooses on this machine (instances.default_instance_count)")
    parser.add_argument("--pairs", type=int, default=1,
                        help="in process then through Triton, this many times (A B A B: the host's drift cancels); "
                             "the summary gives each load's median and spread")
    parser.add_argument("--skip-in-process", action="store_true")
    parser.add_argument("--skip-triton", action="store_true")
    parser.add_argument("--stagger", action="store_true",
                        help="in process: start the streams spread over one request's steps (as they arrive through "
                             "Triton), not all at once")
    parser.add_argument("--model-dir", default=None, help="a Hugging Face checkpoint for both sides (default SmolLM2)")
    parser.add_argument("--tiny-model", action="store_true",
                        help="both sides serve a tiny random-weight Llama (bench/tiny_checkpoint.py): the model's "
                             "step costs little, so the serving path's own cost shows, as with SmolLM2 on an H200")
    parser.add_argument("--engine-process", choices=("true", "false"), default=None,
                        help="engine in a worker process (true) or on a thread (false), both sides; default: the "
                             "server's default, and a thread in process")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    RESULTS = args.results_dir
    served = dict(item.split("=", 1) for item in args.param)
    if args.engine_process is None and "engine_process" in served:  # the server's layout, in process too
        args.engine_process = served["engine_process"]
    if args.tiny_model and not args.model_dir:
        from tiny_checkpoint import write_tiny_checkpoint

        args.model_dir = str(write_tiny_checkpoint(RESULTS / "tiny-llama"))
    args.stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    args.instances_used = args.instances if args.instances is not None else product_instances(args)
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "cpus": os.cpu_count(),
                    "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                    "settings": {"instances": args.instances, "instances_used": args.instances_used,
                                 "card": card_name(args.device), "max_batch_size": max(args.loads),
                                 "params": served},
                    "runs": []}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"e2e-{args.stamp}.json"
    for pair in range(args.pairs):
        run = {"in_process": [] if args.skip_in_process else in_process_apart(args, args.loads)}
        workdir = RESULTS / f"e2e-server-{args.stamp}-{pair}"  # kept: its server.log explains a failed start
        run["triton"] = [] if args.skip_triton else through_triton(args, args.loads, workdir)
        report["runs"].append(run)
        report["in_process"], report["triton"] = run["in_process"], run["triton"]  # the last pair, as before
        path.write_text(json.dumps(report, indent=2,
                                   default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
        print_table(run)
    report["summary"] = paired_summary(report["runs"])
    path.write_text(json.dumps(report, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    print(f"\nresults: {path} (instances {args.instances_used}"
          f"{'' if args.instances is not None else ', the default'}, card {report['settings']['card']})\n")
    for line in summary_lines(report["summary"]):
        print(line)
    return 0


def product_instances(args) -> int:
    """The instance count `trtllm-triton serve` would choose here for these settings."""
    from trtllm_model.triton.instances import default_instance_count, usable_cores

    served = dict(item.split("=", 1) for item in args.param)
    engine_process = (args.engine_process or served.get("engine_process", str(args.device != "cpu"))).lower() == "true"
    return default_instance_count("transformers", args.device, engine_process, usable_cores())


def card_name(device: str) -> str:
    if device == "cpu":
        import platform

        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def paired_summary(runs: list[dict]) -> list[dict]:
    """Per load: each pair's ratio (Triton / in process of the same pair), then medians and spreads."""
    loads = sorted({p["load_streams"] for run in runs for p in run["triton"]})
    rows = []
    for load in loads:
        ratios, delivered, generated, gap50, gap99, ttft50, errors = [], [], [], [], [], [], 0
        for run in runs:
            t = next((p for p in run["triton"] if p["load_streams"] == load), None)
            q = next((p for p in run["in_process"] if p["load_streams"] == load), None)
            if t is None:
                continue
            delivered.append(t["delivered_tokens_per_s"])
            gap50.append(t["gap_p50_ms"])
            gap99.append(t["gap_p99_ms"])
            ttft50.append(t["ttft_p50_ms"])
            errors += t["error_count"]
            if q and q.get("generated_tokens_per_s"):
                generated.append(q["generated_tokens_per_s"])
                ratios.append(t["delivered_tokens_per_s"] / q["generated_tokens_per_s"])
        rows.append({"load_streams": load, "pairs": len(delivered), "ratios": ratios,
                     "ratio_median": percentile(ratios, 50), "delivered_median": percentile(delivered, 50),
                     "delivered_spread_pct": _spread(delivered), "generated_median": percentile(generated, 50),
                     "gap_p50_ms_median": percentile([g for g in gap50 if g is not None], 50),
                     "gap_p99_ms_median": percentile([g for g in gap99 if g is not None], 50),
                     "ttft_p50_ms_median": percentile([t for t in ttft50 if t is not None], 50), "errors": errors})
    return rows


def _spread(values: list[float]) -> float | None:
    """(max - min) / median, in percent."""
    middle = percentile(values, 50)
    return None if not values or not middle else 100.0 * (max(values) - min(values)) / middle


def summary_lines(rows: list[dict]) -> list[str]:
    lines = ["| streams | pairs | in process tok/s (median) | via Triton tok/s (median, spread) | ratio median (each) | "
             "TTFT p50 ms | gap p50 / p99 ms | errors |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        each = ", ".join(f"{x:.2f}" for x in r["ratios"])
        lines.append(f"| {r['load_streams']} | {r['pairs']} | {_fmt(r['generated_median'], 0)} | "
                     f"{_fmt(r['delivered_median'], 0)} ({_fmt(r['delivered_spread_pct'])} %) | "
                     f"{_fmt(r['ratio_median'], 3)} ({each}) | {_fmt(r['ttft_p50_ms_median'])} | "
                     f"{_fmt(r['gap_p50_ms_median'])} / {_fmt(r['gap_p99_ms_median'])} | {r['errors']} |")
    return lines


def print_table(report: dict) -> None:
    inproc = {p["load_streams"]: p for p in report["in_process"]}
    print("| streams | in process tok/s | via Triton tok/s | ratio | TTFT p50 / p99 ms (Triton) | TTFT p50 in process ms | "
          "response gap p50 / p99 ms | per-token gap p50 / p99 ms | tok/response | server CPU cores |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in report["triton"]:
        q = inproc.get(p["load_streams"], {})
        generated = q.get("generated_tokens_per_s")
        ratio = p["delivered_tokens_per_s"] / generated if generated else None
        print(f"| {p['load_streams']} | {_fmt(generated, 0)} | {p['delivered_tokens_per_s']:.0f} | {_fmt(ratio, 3)} | "
              f"{_fmt(p['ttft_p50_ms'])} / {_fmt(p['ttft_p99_ms'])} | {_fmt(q.get('ttft_p50_ms'))} | "
              f"{_fmt(p['gap_p50_ms'])} / {_fmt(p['gap_p99_ms'])} | {_fmt(p['gap_per_token_p50_ms'], 2)} / "
              f"{_fmt(p['gap_per_token_p99_ms'], 2)} | {_fmt(p['tokens_per_response'], 2)} | {p['server_cpu_cores']:.2f} |")
        if ratio is not None:
            print(f"  {p['load_streams']} streams: delivered / in-process generated {ratio:.3f}")


if __name__ == "__main__":
    sys.exit(main())
