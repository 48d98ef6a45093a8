"""Idle CPU of the serving process tree (tritonserver + Python stubs) with no requests in flight.

    .venv/bin/python bench/idle_cpu.py [--executor synthetic] [--seconds 20]

Starts a real server on free ports, warms it with one request, waits, then samples the CPU time of every process
in the tree over a window and prints the share of one core. Target: under 1 %.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import start_server  # noqa: E402
from triton_client import stream_once, text_inputs, token_inputs  # noqa: E402


def tree_cpu_seconds(root: psutil.Process) -> float:
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executor", default=None, help="override the repository's executor (default: its config)")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        server = start_server(Path(workdir), executor=args.executor)
        try:
            warm = token_inputs([1, 2, 3], 4) if args.executor == "synthetic" else text_inputs("Hello", 4)
            result = stream_once(server.grpc_url, "tensorrt_llm", warm, timeout_s=120)
            assert not result.errors, result.errors
            time.sleep(3)  # let the warm-up request's work settle
            root = psutil.Process(server.process.pid)
            before, started = tree_cpu_seconds(root), time.monotonic()
            time.sleep(args.seconds)
            used, elapsed = tree_cpu_seconds(root) - before, time.monotonic() - started
            share = 100.0 * used / elapsed
            processes = len(root.children(recursive=True)) + 1
            print(f"idle CPU over {elapsed:.1f} s, {processes} processes: {used:.3f} CPU-s = {share:.2f} % of one core "
                  f"(target < 1 %: {'met' if share < 1.0 else 'NOT met'})")
            return 0 if share < 1.0 else 1
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
