"""Where a `tensorrt_llm` stub's time goes while short requests stream: a server on the synthetic executor, N gRPC
streams each sending 64-token `ensemble` requests one after another (bench/e2e.py's client), and py-spy sampling
each stub for the window; prints delivered tokens/s, responses/s, requests/s and the stubs' cores, then the leaf
functions by share of the samples. With py-spy it also gives each stub thread's CPU over the window by the thread's
Python name (py-spy's samples name the OS threads): the delivery workers' CPU a response, the main thread's
(`execute()` and the stub's own request intake) a request, the cancel watch's and the metrics thread's a request.

    .venv/bin/python bench/stub_profile.py --streams 128 --step-ms 2 --window 12 --py-spy PATH/TO/py-spy [--json F]

py-spy is not a project dependency: install it anywhere (e.g. a venv of its own) and pass its path.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR.parent / "tests"), str(BENCH_DIR)]

import e2e  # noqa: E402


def leaf_shares(raw: Path, top: int = 12) -> list[tuple[float, str]]:
    """py-spy's raw (collapsed) stacks: the leaf frames by share of the samples."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        counts[stack.split(";")[-1]] += int(count)
    total = sum(counts.values()) or 1
    return [(count / total, leaf) for leaf, count in counts.most_common(top)]


def thread_names(raw: Path) -> dict[int, str]:
    """OS thread id -> Python thread name, from py-spy's --threads stacks ("thread (TID): NAME" first)."""
    names = {}
    for line in raw.read_text().splitlines():
        found = re.match(r"thread \((\d+)\): ([^;]+)", line)
        if found:
            names[int(found.group(1))] = found.group(2)
    return names


def thread_cpu(process) -> dict[int, float]:
    """OS thread id -> user + system seconds so far."""
    return {t.id: t.user_time + t.system_time for t in process.threads()}


def cpu_by_role(before: dict[int, float], after: dict[int, float], names: dict[int, str]) -> dict[str, float]:
    """CPU seconds over the window by role: worker-N threads summed, other Python threads by name, threads py-spy
    never saw running Python (the stub's own C++ threads, idle ones) as "other"."""
    roles: dict[str, float] = collections.defaultdict(float)
    for tid, seconds in after.items():
        name = names.get(tid, "other")
        roles["workers" if name.startswith("worker-") else name] += seconds - before.get(tid, 0.0)
    return dict(roles)


def main() -> int:
    import psutil
    from conftest import start_server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--step-ms", default="2")
    parser.add_argument("--window", type=float, default=12.0)
    parser.add_argument("--py-spy", default=None, help="py-spy's path; without it, no profile")
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--timing-s", type=float, default=0.0,
                        help="the stub logs its per-phase delivery breakdown every S s (TRTLLM_DELIVERY_TIMING_S; "
                             "timing costs the stub CPU: a breakdown, not a throughput figure); printed at the end")
    args = parser.parse_args()
    work = args.results_dir / f"stub-profile-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    env = {"TRTLLM_DELIVERY_TIMING_S": f"{args.timing_s:g}"} if args.timing_s else None
    server = start_server(work, executor="synthetic", ready_timeout_s=600, env=env,
                          parameters={"synthetic_step_ms": args.step_ms, "max_batch_size": str(max(64, args.streams))})
    try:
        root = psutil.Process(server.process.pid)
        triton = next(p for p in [root, *root.children(recursive=True)] if p.name() == "tritonserver")
        stubs = [p for p in root.children(recursive=True) if "tensorrt_llm" in " ".join(p.cmdline())]
        with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
            list(pool.map(time.sleep, [0.5] * 2))  # the workers' imports, before the clock starts
            start = time.monotonic() + 1.5
            w0, w1 = start + 3, start + 3 + args.window
            plans = [e2e.Plan(server.grpc_url, args.streams // 2, p * 1000, e2e.questions(256), 64, start, w0, w1)
                     for p in range(2)]
            futures = [pool.submit(e2e.run_worker, plan) for plan in plans]
            time.sleep(max(0.0, w0 - time.monotonic()))
            cpu0 = [sum(p.cpu_times()[:2]) for p in stubs]
            server0 = sum(triton.cpu_times()[:2])  # tritonserver itself (its stubs are children, not counted)
            threads0 = [thread_cpu(p) for p in stubs]
            # --nonblocking: sampled without pausing the stub; --threads: the thread names cpu_by_role needs
            spies = [subprocess.Popen([args.py_spy, "record", "--nonblocking", "--threads", "-p", str(p.pid), "-d",
                                       str(int(args.window) - 1), "-f", "raw", "-r", "200",
                                       "-o", str(work / f"stub-{p.pid}.txt")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for p in stubs] if args.py_spy else []
            time.sleep(max(0.0, w1 - time.monotonic()))
            cpu1 = [sum(p.cpu_times()[:2]) for p in stubs]
            server1 = sum(triton.cpu_times()[:2])
            threads1 = [thread_cpu(p) for p in stubs]
            results = [future.result() for future in futures]
            for spy in spies:
                spy.wait()
        tokens, responses = sum(r.tokens for r in results), sum(r.responses for r in results)
        requests = sum(r.requests_done for r in results)
        print(f"{args.streams} streams: {tokens / args.window:.0f} tok/s, {responses / args.window:.0f} responses/s, "
              f"{requests / args.window:.0f} requests/s, "
              f"stubs {[round((b - a) / args.window, 2) for a, b in zip(cpu0, cpu1)]} cores, "
              f"tritonserver {(server1 - server0) / args.window:.2f} cores "
              f"({1e6 * (server1 - server0) / max(responses, 1):.0f} us a response), "
              f"errors {sum(len(r.errors) for r in results)}")
        figures = {"args": {k: str(v) for k, v in vars(args).items()}, "tokens_per_s": tokens / args.window,
                   "responses_per_s": responses / args.window, "requests_per_s": requests / args.window,
                   "stub_cores": [(b - a) / args.window for a, b in zip(cpu0, cpu1)],
                   "tritonserver_cores": (server1 - server0) / args.window,
                   "tritonserver_us_per_response": 1e6 * (server1 - server0) / max(responses, 1),
                   "errors": sum(len(r.errors) for r in results)}
        if args.py_spy and len(stubs) == 1:  # one stub: its threads' CPU per response and per request
            roles = cpu_by_role(threads0[0], threads1[0], thread_names(work / f"stub-{stubs[0].pid}.txt"))
            per_response = {role: 1e6 * seconds / max(responses, 1) for role, seconds in roles.items()}
            per_request = {role: 1e6 * seconds / max(requests, 1) for role, seconds in roles.items()}
            figures.update(thread_cpu_s=roles, us_per_response=per_response, us_per_request=per_request,
                           stub_us_per_response=1e6 * (cpu1[0] - cpu0[0]) / max(responses, 1))
            print(f"stub CPU {figures['stub_us_per_response']:.0f} us a response; by thread: "
                  + ", ".join(f"{role} {seconds / args.window:.3f} cores ({per_response[role]:.1f} us a response, "
                              f"{per_request[role]:.1f} us a request)"
                              for role, seconds in sorted(roles.items(), key=lambda item: -item[1])))
        if args.timing_s:
            lines = [line for line in server.log().splitlines() if "delivery_timing" in line]
            print("\n".join(lines[-3:]))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
        for raw in sorted(work.glob("stub-*.txt")):
            print(f"{raw}:")
            for share, leaf in leaf_shares(raw):
                print(f"  {100 * share:5.1f} %  {leaf}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
