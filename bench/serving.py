"""Token delivery through a real tritonserver: the project's model against a naive NVIDIA-style baseline.

    .venv/bin/python bench/serving.py                       # full run (about 5 minutes), table + JSON + plot
    .venv/bin/python bench/serving.py --loads 0 64 256 --window 5 --skip-perf-analyzer

Both models run the same synthetic executor (trtllm_model.executors.synthetic) at `--step-ms` (10 ms = 100
steps/s), so N streams in flight generate N x 100 tokens/s. For each model in turn a fresh server is started
(only that model loaded) and, for each load N in `--loads`:
  - N load streams (gRPC bidirectional calls, asyncio, split over `--client-procs` processes) each send one
    request long enough to outlive the run, all at once; the executor keeps all N active;
  - one probe stream sends `--probe-tokens`-token requests one after another (time to first token under load);
  - after `--warmup` seconds a `--window`-second window measures: generated tokens/s (a counter inside the
    model process, see bench/counted.py), delivered tokens/s and responses/s (client), gaps between consecutive
    responses of one stream, probe time to first token, CPU of the server process tree (psutil) and of the
    client processes;
  - the streams are cancelled and the server is left to go quiet before the next load.
Load 0 is the probe alone: time to first token at one stream, compared with the same requests made on a
SyntheticExecutor in this process (no Triton, no gRPC). perf_analyzer (bench/perf_analyzer.py) then measures
each server at `--pa-concurrency` as an independent client.

Results: a table on stdout, bench/results/serving-<time>.json, and (with bench/.perf-venv's matplotlib)
bench/results/serving-<time>.png; `--doc-plot` also writes docs/performance.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

import psutil

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(BENCH_DIR))
import perf_analyzer  # noqa: E402
from aio_client import Plan, WorkerResult, run_worker  # noqa: E402
from conftest import Server, set_parameters, start_server, write_repository  # noqa: E402
from counted import CounterFile  # noqa: E402

from trtllm_model.server import is_ready  # noqa: E402

RESULTS = BENCH_DIR / "results"
# ours: the product; baseline: a naive NVIDIA-style model (bench/baseline_model).
MODEL_NAMES = {"ours": "tensorrt_llm", "baseline": "baseline"}


# -- measurement helpers -------------------------------------------------------------------------------------------
def tree_cpu_by_process(root: psutil.Process) -> dict[str, float]:
    """CPU seconds of each process in the server tree, by a short name (tritonserver, stub:<model>, cli)."""
    usage: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            command = process.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "triton_python_backend_stub" in " ".join(command[:1]):
            name = "stub:" + (command[-2] if len(command) > 2 else "?")
        elif command and command[0].endswith("tritonserver"):
            name = "tritonserver"
        else:
            name = "cli"
        usage[name] = usage.get(name, 0.0) + times.user + times.system
    return usage


def tree_cpu_s(root: psutil.Process) -> float:
    return sum(tree_cpu_by_process(root).values())


def percentile(values, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))
    return ordered[index]


def start_profile(root: psutil.Process, label: str, seconds: float) -> subprocess.Popen | None:
    """py-spy (sampling, without pausing the process) over the model's stub for `seconds`: collapsed stacks with
    thread names in RESULTS/profile-<label>.txt. None when py-spy is not installed."""
    py_spy = shutil.which("py-spy")
    stubs = []
    for p in root.children(recursive=True):
        try:
            command = p.cmdline()
        except psutil.Error:  # a stub that died (a zombie) is no reason to lose the run's figures
            continue
        if "triton_python_backend_stub" in " ".join(command[:1]) and "ensemble" not in " ".join(command):
            stubs.append(p)
    if not py_spy or not stubs:
        return None
    RESULTS.mkdir(parents=True, exist_ok=True)
    # --subprocesses: the embedded engine's worker process (engine_process=true) is a child of the stub.
    # PYSPY_NATIVE=1: native frames too (C extensions, the stub's IPC); py-spy then pauses the process to sample, so
    # such a run profiles only and gives no figures.
    sampling = ["--native", "-r", "50"] if os.environ.get("PYSPY_NATIVE") == "1" else ["--nonblocking", "-r", "200"]
    command = [py_spy, "record", *sampling, "--threads", "--subprocesses", "-d", str(max(1, int(seconds))),
               "-f", "raw", "-o", str(RESULTS / f"profile-{label}.txt"), "-p", str(stubs[0].pid)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def wait_quiet(root: psutil.Process, below_cores: float = 0.05, timeout_s: float = 240.0) -> float:
    """Wait until the server tree uses under `below_cores` over half a second; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = tree_cpu_s(root)
        time.sleep(0.5)
        if (tree_cpu_s(root) - before) / 0.5 < below_cores:
            break
    return time.monotonic() - started


def in_process_ttft(step_ms: float, samples: int, pause_s: float) -> list[float]:
    """Time to first token of SyntheticExecutor called directly, requests one after another (as the probe does)."""
    from trtllm_model.executor_interface import GenerationRequest
    from trtllm_model.executors.synthetic import SyntheticExecutor

    executor = SyntheticExecutor(step_ms=step_ms, max_batch_size=8)
    ttfts = []
    try:
        for number in range(samples + 5):
            sent = time.monotonic()
            request_id = executor.enqueue(GenerationRequest(input_ids=[7, number], max_tokens=1))
            first = None
            while first is None:
                for step in executor.await_steps(1.0):
                    if step.request_id == request_id and step.token_ids:
                        first = time.monotonic()
            if number >= 5:  # the first few warm the thread up
                ttfts.append(first - sent)
            time.sleep(pause_s)
    finally:
        executor.shutdown()
    return ttfts


# -- servers ---------------------------------------------------------------------------------------------------
def start(kind: str, workdir: Path, step_ms: float, max_batch: int, counter: CounterFile,
          extra: dict[str, str] | None = None, args=None) -> Server:
    env = {"BENCH_DIR": str(BENCH_DIR), "BENCH_COUNTER_FILE": counter.path}
    parameters = {"max_batch_size": str(max_batch), "synthetic_step_ms": f"{step_ms:g}"}
    if kind == "ours":
        text = args is not None and args.text
        repository = write_repository(workdir / "repository", {**parameters, "max_queue_size": "1024", **(extra or {})},
                                      models=("tensorrt_llm", "ensemble") if text else ("tensorrt_llm",))
        shutil.copy(BENCH_DIR / "counted_model.py", repository / "tensorrt_llm" / "1" / "model.py")
        if args is not None and args.code:
            env["BENCH_CODE_DIR"] = str(args.code.resolve())  # counted_model.py imports trtllm_model from there
        if args is not None and args.timing_s:
            env["TRTLLM_DELIVERY_TIMING_S"] = f"{args.timing_s:g}"
        return start_server(workdir, executor="synthetic", repository=repository, env=env)
    repository = workdir / "repository"
    shutil.rmtree(repository, ignore_errors=True)
    shutil.copytree(BENCH_DIR / f"{kind}_model", repository, ignore=shutil.ignore_patterns("__pycache__"))
    config = repository / MODEL_NAMES[kind] / "config.pbtxt"
    config.write_text(set_parameters(config.read_text(), parameters))
    return start_server(workdir, executor=None, repository=repository, env=env)


def measure_point(server: Server, model: str, counter: CounterFile, pool: ProcessPoolExecutor, args, load: int,
                  seed: int) -> dict:
    rate = 1000.0 / args.step_ms
    procs = max(1, min(args.client_procs, load)) if load else 1
    start_at = time.monotonic() + args.connect_s
    w0 = start_at + args.warmup
    w1 = w0 + args.window
    load_tokens = int((args.warmup + args.window + args.connect_s + 5.0) * rate)
    plans = []
    for worker in range(procs):
        share = load // procs + (1 if worker < load % procs else 0)
        plans.append(Plan(
            url=server.grpc_url, model=model, load_streams=share, load_tokens=load_tokens, probe=worker == 0,
            probe_tokens=args.probe_tokens, probe_pause_s=args.probe_pause_ms / 1000.0, start=start_at, w0=w0, w1=w1,
            channels=args.channels, first_input_id=seed * 1000 + worker * 100 + 1, step_s=args.step_ms / 1000.0,
            text=args.text and model == "ensemble",
        ))
    futures = [pool.submit(run_worker, plan) for plan in plans]
    root = psutil.Process(server.process.pid)
    time.sleep(max(0.0, w0 - time.monotonic()))
    profile = None
    if args.profile_s and load == max(args.loads):
        profile = start_profile(root, f"serving-{model}-{load}", min(args.profile_s, args.window))
    generated0, by0, t0 = counter.read(), tree_cpu_by_process(root), time.monotonic()
    time.sleep(max(0.0, w1 - time.monotonic()))
    generated1, by1, t1 = counter.read(), tree_cpu_by_process(root), time.monotonic()
    timing = last_timing_line(server.log()) if args.timing_s else None  # logged inside the window
    cpu0, cpu1 = sum(by0.values()), sum(by1.values())
    results: list[WorkerResult] = [future.result(timeout=args.warmup + args.window + 120) for future in futures]
    if profile is not None:
        profile.wait(timeout=60)
    quiet_s = wait_quiet(root, timeout_s=args.quiet_timeout)
    elapsed = t1 - t0
    tokens = sum(r.tokens for r in results)
    responses = sum(r.responses for r in results)
    gaps = [g for r in results for g in r.gaps]
    lags = [g for r in results for g in r.lags]
    ttft = [t for r in results for t in r.ttft]
    burst = [t for r in results for t in r.burst_ttft]
    client_cpu = [r.cpu_s / args.window for r in results]
    errors = [e for r in results for e in r.errors]
    ms = 1000.0
    point = {
        "load_streams": load,
        "offered_tokens_per_s": load * rate,
        "generated_tokens_per_s": (generated1 - generated0) / elapsed,
        "delivered_tokens_per_s": tokens / args.window,
        "responses_per_s": responses / args.window,
        "tokens_per_response": tokens / responses if responses else None,
        "gap_p50_ms": _scale(percentile(gaps, 50), ms),
        "gap_p99_ms": _scale(percentile(gaps, 99), ms),
        "lag_p50_ms": _scale(percentile(lags, 50), ms),
        "lag_p99_ms": _scale(percentile(lags, 99), ms),
        "ttft_p50_ms": _scale(percentile(ttft, 50), ms),
        "ttft_p99_ms": _scale(percentile(ttft, 99), ms),
        "ttft_samples": len(ttft),
        "ttft_censored": sum(r.ttft_censored for r in results),
        "burst_ttft_p50_ms": _scale(percentile(burst, 50), ms),
        "burst_ttft_p99_ms": _scale(percentile(burst, 99), ms),
        "server_cpu_cores": (cpu1 - cpu0) / elapsed,
        "server_cpu_cores_by_process": {name: (by1[name] - by0.get(name, 0.0)) / elapsed for name in by1},
        "client_procs": procs,
        "client_cpu_cores_max_proc": max(client_cpu),
        "client_cpu_cores_total": sum(client_cpu),
        "quiet_after_s": quiet_s,
        "errors": errors[:10],
        "error_count": len(errors),
        "delivery_timing": timing,
    }
    point["delivered_over_generated"] = (point["delivered_tokens_per_s"] / point["generated_tokens_per_s"]
                                         if point["generated_tokens_per_s"] else None)
    point["server_cpu_cores_per_10k_delivered"] = (10000.0 * point["server_cpu_cores"] / point["delivered_tokens_per_s"]
                                                   if point["delivered_tokens_per_s"] else None)
    return point


def last_timing_line(log: str) -> str | None:
    """The model's latest per-response breakdown (TRTLLM_DELIVERY_TIMING_S); read at the window's end, it lies
    inside the window when --timing-s is shorter than it."""
    lines = [line for line in log.splitlines() if "delivery timing over" in line]
    return lines[-1].split("delivery timing ", 1)[1] if lines else None


def _scale(value, factor):
    return None if value is None else value * factor


def measure_model(kind: str, model: str, args, workroot: Path) -> dict:
    counter = CounterFile(str(workroot / f"{kind}.counter"))
    extra = dict(item.split("=", 1) for item in args.param) if kind == "ours" else {}
    server = start(kind, workroot / kind, args.step_ms, args.max_batch, counter, extra, args)
    if kind == "ours" and args.text:
        model = "ensemble"
    report: dict = {"model": model, "points": [], "perf_analyzer": []}
    try:
        root = psutil.Process(server.process.pid)
        time.sleep(2)
        idle0 = tree_cpu_s(root)
        time.sleep(args.idle_s)
        report["idle_cpu_cores_before_load"] = (tree_cpu_s(root) - idle0) / args.idle_s
        with ProcessPoolExecutor(max_workers=args.client_procs, mp_context=get_context("spawn")) as pool:
            # Start every worker process before the first load point (spawning takes seconds on a busy box).
            list(pool.map(time.sleep, [0.5] * args.client_procs))
            for seed, load in enumerate(args.loads):
                if report["points"] and report["points"][-1]["quiet_after_s"] >= args.quiet_timeout:
                    # Still sending a backlog (a model that cannot keep up): a fresh server, not minutes of waiting.
                    report["points"][-1]["server_restarted_after"] = True
                    _keep_log(server, kind, args, stop=True)
                    server = start(kind, workroot / kind, args.step_ms, args.max_batch, counter, extra, args)
                    root = psutil.Process(server.process.pid)
                if server.process.poll() is not None or not is_ready("127.0.0.1", server.http_port):
                    report["failed"] = f"server not running/ready before load {load}; see {RESULTS}/server-{args.stamp}-{kind}.log"
                    print(f"  {kind}: {report['failed']}", flush=True)
                    break
                point = measure_point(server, model, counter, pool, args, load, seed)
                report["points"].append(point)
                print(f"  {kind:8s} load {load:4d}: generated {point['generated_tokens_per_s']:8.0f}  delivered "
                      f"{point['delivered_tokens_per_s']:8.0f}  responses/s {point['responses_per_s']:7.0f}  lag p50 "
                      f"{_fmt(point['lag_p50_ms'])} ms  gap p50 "
                      f"{_fmt(point['gap_p50_ms'])} ms  ttft p50 {_fmt(point['ttft_p50_ms'])} ms  server CPU "
                      f"{point['server_cpu_cores']:.2f}  client CPU max {point['client_cpu_cores_max_proc']:.2f}  "
                      f"errors {point['error_count']}", flush=True)
                print("    server CPU by process: " + ", ".join(
                    f"{name} {cores:.2f}" for name, cores in point["server_cpu_cores_by_process"].items()), flush=True)
                if point["delivery_timing"]:
                    print(f"    delivery timing {point['delivery_timing']}", flush=True)
                for error in point["errors"][:3]:
                    print(f"    error: {error}", flush=True)
        if not args.skip_perf_analyzer:
            runs = [(1, 1)] + [(concurrency, args.pa_tokens) for concurrency in args.pa_concurrency]
            for concurrency, tokens in runs:  # c=1 with 1-token requests: latency = time to first token
                pa = perf_analyzer.run(server.grpc_url, model, concurrency, tokens)
                pa.pop("output", None) if "error" not in pa else None
                report["perf_analyzer"].append(pa)
                print(f"  {kind:8s} perf_analyzer c={concurrency} x {tokens} tokens: {_pa_line(pa)}", flush=True)
                wait_quiet(root)
    finally:
        _keep_log(server, kind, args, stop=True)
        counter.close()
    return report


def _keep_log(server: Server, kind: str, args, stop: bool) -> None:
    """Stop the server (briefly: a backlog is not worth waiting for) and append its log to the results."""
    if stop:
        try:
            tree = psutil.Process(server.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        server.stop(timeout_s=20)
        for process in tree:  # the wrapper may have been killed: its tritonserver and stubs must not live on
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"server-{args.stamp}-{kind}.log", "a") as log:
        log.write(server.log())


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pa_line(pa: dict) -> str:
    if "error" in pa:
        return f"error: {pa['error']}"
    return (f"{pa['tokens_per_s']:.0f} tokens/s ({pa['requests_per_s']:.1f} requests/s x {pa['tokens_per_request']}), "
            f"responses/s {_fmt(pa['responses_per_s'], 0)}, latency p50 {pa['latency_p50_ms']:.2f} ms")


# -- report ----------------------------------------------------------------------------------------------------
def table(report: dict) -> str:
    ours, base = report["ours"], report.get("baseline", {"points": []})
    by_load = {p["load_streams"]: p for p in base["points"]}
    rows = ["| streams | offered tok/s | model | generated tok/s | delivered tok/s | delivered/generated | responses/s | "
            "tok/response | gap p50 / p99 ms | token lag p50 / p99 ms | probe TTFT p50 / p99 ms | server CPU (cores) | "
            "server cores per 10k delivered tok/s | client CPU (max proc) |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for point in ours["points"]:
        pair = [("ours", point)]
        if point["load_streams"] in by_load:
            pair.append(("baseline", by_load[point["load_streams"]]))
        for name, p in pair:
            ttft = f"{_fmt(p['ttft_p50_ms'])} / {_fmt(p['ttft_p99_ms'])}"
            if p["ttft_censored"]:
                ttft += f" ({p['ttft_censored']} of {p['ttft_samples']} never came: lower bound)"
            rows.append(
                f"| {p['load_streams']} | {p['offered_tokens_per_s']:.0f} | {name} | {p['generated_tokens_per_s']:.0f} | "
                f"{p['delivered_tokens_per_s']:.0f} | {_fmt(p['delivered_over_generated'], 3)} | {p['responses_per_s']:.0f} | "
                f"{_fmt(p['tokens_per_response'], 2)} | {_fmt(p['gap_p50_ms'])} / {_fmt(p['gap_p99_ms'])} | "
                f"{_fmt(p['lag_p50_ms'])} / {_fmt(p['lag_p99_ms'])} | {ttft} | "
                f"{p['server_cpu_cores']:.2f} | {_fmt(p.get('server_cpu_cores_per_10k_delivered'), 2)} | "
                f"{p['client_cpu_cores_max_proc']:.2f} |")
    rows.append("")
    rows.append("| ratio ours / baseline | delivered tok/s | responses/s | gap p50 (baseline / ours) |")
    rows.append("|---:|---:|---:|---:|")
    for point in ours["points"]:
        other = by_load.get(point["load_streams"])
        if other is None or not point["load_streams"]:
            continue
        gap_ratio = (other["gap_p50_ms"] / point["gap_p50_ms"]) if other["gap_p50_ms"] and point["gap_p50_ms"] else None
        rows.append(f"| {point['load_streams']} streams | "
                    f"{point['delivered_tokens_per_s'] / max(other['delivered_tokens_per_s'], 1e-9):.2f}x | "
                    f"{point['responses_per_s'] / max(other['responses_per_s'], 1e-9):.2f}x | {_fmt(gap_ratio, 2)}x |")
    return "\n".join(rows)


def targets(report: dict) -> list[str]:
    ours = {p["load_streams"]: p for p in report["ours"]["points"]}
    base = {p["load_streams"]: p for p in report.get("baseline", {"points": []})["points"]}
    lines = []
    top = max(ours)
    if top in base:
        o, b = ours[top], base[top]
        ratio = o["delivered_over_generated"] or 0
        lines.append(f"{top} streams, {o['generated_tokens_per_s']:.0f} tokens/s generated: delivered/generated "
                     f"{ratio:.3f} (target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")
        x = o["delivered_tokens_per_s"] / max(b["delivered_tokens_per_s"], 1e-9)
        lines.append(f"{top} streams: delivered {x:.2f}x the baseline's (target >= 5x: {'met' if x >= 5 else 'NOT met'})")
    if 64 in ours and 64 in base and ours[64]["gap_p50_ms"] and base[64]["gap_p50_ms"]:
        o, b = ours[64]["gap_p50_ms"], base[64]["gap_p50_ms"]
        lines.append(f"64 streams: gap p50 {o:.2f} ms vs baseline {b:.2f} ms (target ours <= baseline: "
                     f"{'met' if o <= b else 'NOT met'})")
    if top and ours[top]["ttft_p50_ms"] is not None:
        ttft = ours[top]["ttft_p50_ms"]
        limit = 3 * report["args"]["step_ms"]
        lines.append(f"{top} streams: probe TTFT p50 {ttft:.1f} ms under load (target <= 3 steps = {limit:g} ms: "
                     f"{'met' if ttft <= limit else 'NOT met'})")
    if 0 in ours and ours[0]["ttft_p50_ms"] is not None:
        inproc = report["in_process_ttft_p50_ms"]
        for client, key in (("asyncio probe", "probe"), ("perf_analyzer", "perf_analyzer")):
            ttft = _ttft_p50_ms(report["ours"], key)
            if ttft is not None:
                over = ttft - inproc
                lines.append(f"1 stream, {client}: TTFT p50 {ttft:.2f} ms through Triton vs {inproc:.2f} ms in process: "
                             f"+{over:.2f} ms (target <= 2 ms: {'met' if over <= 2.0 else 'NOT met'})")
    idle = report["ours"].get("idle_cpu_cores_before_load")
    if idle is not None:
        lines.append(f"idle CPU (server tree, {report['args']['idle_s']:.0f} s before load): {100 * idle:.2f} % of a core "
                     f"(target < 1 %: {'met' if idle < 0.01 else 'NOT met'}; bench/idle_cpu.py measures it on its own)")
    return lines


def _ttft_p50_ms(model_report: dict, client: str) -> float | None:
    """TTFT p50 at one stream: the asyncio probe at load 0, or perf_analyzer's c=1 run of 1-token requests."""
    if client == "probe":
        return next((p["ttft_p50_ms"] for p in model_report["points"] if p["load_streams"] == 0), None)
    return next((pa.get("latency_p50_ms") for pa in model_report["perf_analyzer"]
                 if pa.get("concurrency") == 1 and pa.get("tokens_per_request") == 1), None)


def plot(report_path: Path, png: Path) -> None:
    python = perf_analyzer.ensure_venv()
    subprocess.run([str(python), str(BENCH_DIR / "plot.py"), str(report_path), str(png)], check=True)


def main() -> int:
    global RESULTS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 16, 64, 128, 192, 256])
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--max-batch", type=int, default=512, help="executor max_batch_size (>= largest load + 1)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--connect-s", type=float, default=1.5, help="time the client processes get to connect")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--channels", type=int, default=4, help="gRPC channels per client process")
    parser.add_argument("--probe-tokens", type=int, default=1)
    parser.add_argument("--probe-pause-ms", type=float, default=0.0,
                        help="pause between probe requests (0: a closed loop, as perf_analyzer's); the in-process "
                             "reference uses the same")
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--profile-s", type=float, default=0.0,
                        help="py-spy the model's stub this long during the largest load's window (0: no profile)")
    parser.add_argument("--quiet-timeout", type=float, default=240.0,
                        help="after a load point, wait at most this long for the server to go quiet; past it the "
                             "next point gets a fresh server")
    parser.add_argument("--in-process-samples", type=int, default=200)
    parser.add_argument("--models", nargs="+", default=list(MODEL_NAMES), choices=list(MODEL_NAMES))
    parser.add_argument("--skip-perf-analyzer", action="store_true")
    parser.add_argument("--pa-concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--pa-tokens", type=int, default=50)
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config.pbtxt parameter for our model (e.g. sender_threads=4)")
    parser.add_argument("--text", action="store_true",
                        help="ours only: text requests to `ensemble` (text_output back), as NVIDIA's text clients")
    parser.add_argument("--code", type=Path, default=None, metavar="TREE",
                        help="ours: serve the trtllm_model package of this checkout (e.g. a git worktree of an older "
                             "commit) instead of the installed one")
    parser.add_argument("--timing-s", type=float, default=0.0, metavar="S",
                        help="the model logs its per-response delivery breakdown every S s (TRTLLM_DELIVERY_TIMING_S); "
                             "each load's last line is printed and kept in the results")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--doc-plot", action="store_true", help="also write docs/performance.png")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help=f"where results go (default {RESULTS})")
    args = parser.parse_args()

    RESULTS = args.results_dir
    stamp = args.stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    report: dict = {"args": vars(args), "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                    "load_before": os.getloadavg(), "cpus": os.cpu_count()}
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    if max(args.loads) >= args.max_batch:
        parser.error(f"--max-batch {args.max_batch} must exceed the largest load ({max(args.loads)}) by the probe")
    ttft = in_process_ttft(args.step_ms, args.in_process_samples, args.probe_pause_ms / 1000.0)
    report["in_process_ttft_p50_ms"] = 1000 * statistics.median(ttft)
    report["in_process_ttft_p99_ms"] = 1000 * percentile(ttft, 99)
    print(f"  in-process SyntheticExecutor TTFT p50 {report['in_process_ttft_p50_ms']:.2f} ms, "
          f"p99 {report['in_process_ttft_p99_ms']:.2f} ms", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as workroot:
        for kind in args.models:
            report[kind] = measure_model(kind, MODEL_NAMES[kind], args, Path(workroot))
    report["load_after"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"serving-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    print(f"\nresults: {path}  (load average after: {report['load_after']})\n")
    if "ours" in report:
        print(table(report))
        print()
        for line in targets(report):
            print(line)
    for kind in args.models:
        for pa in report[kind]["perf_analyzer"]:
            print(f"perf_analyzer {kind} c={pa.get('concurrency')} x {pa.get('tokens_per_request')} tokens: {_pa_line(pa)}")
    if not args.no_plot and "ours" in report and "baseline" in report:
        png = path.with_suffix(".png")
        plot(path, png)
        print(f"plot: {png}")
        if args.doc_plot:
            shutil.copy(png, ROOT / "docs" / "performance.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
