"""Where a `tensorrt_llm` stub's time goes while short requests stream: a server on the synthetic executor, N gRPC
streams each sending 64-token `ensemble` requests one after another (bench/e2e.py's client), and py-spy sampling
each stub for the window; prints delivered tokens/s, responses/s, requests/s and the stubs' cores, then the leaf
functions by share of the samples.

    .venv/bin/python bench/stub_profile.py --streams 128 --step-ms 2 --window 12 --py-spy PATH/TO/py-spy

py-spy is not a project dependency: install it anywhere (e.g. a venv of its own) and pass its path.
"""

from __future__ import annotations

import argparse
import collections
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


def main() -> int:
    import psutil
    from conftest import start_server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--step-ms", default="2")
    parser.add_argument("--window", type=float, default=12.0)
    parser.add_argument("--py-spy", default=None, help="py-spy's path; without it, no profile")
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    args = parser.parse_args()
    work = args.results_dir / f"stub-profile-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    server = start_server(work, executor="synthetic", ready_timeout_s=600,
                          parameters={"synthetic_step_ms": args.step_ms, "max_batch_size": str(max(64, args.streams))})
    try:
        root = psutil.Process(server.process.pid)
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
            spies = [subprocess.Popen([args.py_spy, "record", "-p", str(p.pid), "-d", str(int(args.window) - 1), "-f",
                                       "raw", "-r", "200", "-o", str(work / f"stub-{p.pid}.txt")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for p in stubs] if args.py_spy else []
            time.sleep(max(0.0, w1 - time.monotonic()))
            cpu1 = [sum(p.cpu_times()[:2]) for p in stubs]
            results = [future.result() for future in futures]
            for spy in spies:
                spy.wait()
        tokens, responses = sum(r.tokens for r in results), sum(r.responses for r in results)
        print(f"{args.streams} streams: {tokens / args.window:.0f} tok/s, {responses / args.window:.0f} responses/s, "
              f"{sum(r.requests_done for r in results) / args.window:.0f} requests/s, "
              f"stubs {[round((b - a) / args.window, 2) for a, b in zip(cpu0, cpu1)]} cores, "
              f"errors {sum(len(r.errors) for r in results)}")
        for raw in sorted(work.glob("stub-*.txt")):
            print(f"{raw}:")
            for share, leaf in leaf_shares(raw):
                print(f"  {100 * share:5.1f} %  {leaf}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
