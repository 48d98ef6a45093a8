"""Tokens/s of one 16-token `ensemble` request when the server owns the machine, and beside busy-loop processes.

    .venv/bin/python bench/busy_core.py                                   # the default configuration
    .venv/bin/python bench/busy_core.py --param torch_threads=2           # fixed threads (the code before issue 24)
    .venv/bin/python bench/busy_core.py --param engine_process=false      # the engine on a thread of the stub

Starts one tritonserver with the transformers executor (embedded SmolLM2, CPU), sends --requests greedy requests of
--max-tokens tokens each (min_tokens = max_tokens) one after another to `ensemble` over gRPC streaming, first with
nothing else started, then beside --busy processes that each spin on a core (`while True: pass`), started here
--settle seconds before the first timed request. Prints the median latency and tokens/s of each phase and the ratio
busy / idle (issue 24's target: at least 0.5 with one busy core).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
sys.path.insert(0, str(BENCH_DIR.parent))

from conftest import start_server  # noqa: E402
from triton_client import stream_once, text_inputs  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."


def timed_requests(url: str, count: int, max_tokens: int) -> list[float]:
    latencies = []
    for _ in range(count):
        inputs = text_inputs(PROMPT, max_tokens, min_tokens=(max_tokens, np.int32))
        started = time.monotonic()
        result = stream_once(url, "ensemble", inputs, timeout_s=300)
        latencies.append(time.monotonic() - started)
        if result.errors or result.finals != 1:
            raise RuntimeError(f"request failed: {result.errors}")
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5, help="timed requests per phase (default 5)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--busy", type=int, default=1, help="busy-loop processes in the second phase (default 1)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between starting the load and measuring")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a tensorrt_llm config parameter (repeatable)")
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    args = parser.parse_args()
    parameters = dict(item.split("=", 1) for item in args.param)

    with tempfile.TemporaryDirectory(prefix="busy-core-") as workdir:
        server = start_server(Path(workdir), executor="transformers", parameters=parameters)
        try:
            timed_requests(server.grpc_url, 2, args.max_tokens)  # warm-up
            idle = timed_requests(server.grpc_url, args.requests, args.max_tokens)
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
            try:
                time.sleep(args.settle)
                busy = timed_requests(server.grpc_url, args.requests, args.max_tokens)
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
        finally:
            server.stop()

    idle_s, busy_s = statistics.median(idle), statistics.median(busy)
    ratio = idle_s / busy_s
    print(f"parameters {parameters or 'default'}; {args.requests} requests of {args.max_tokens} tokens per phase")
    print("| phase | latency p50 s | all s | tok/s |")
    print("|---|---:|---|---:|")
    print(f"| idle | {idle_s:.2f} | {', '.join(f'{s:.2f}' for s in idle)} | {args.max_tokens / idle_s:.1f} |")
    print(f"| beside {args.busy} busy core(s) | {busy_s:.2f} | {', '.join(f'{s:.2f}' for s in busy)} | "
          f"{args.max_tokens / busy_s:.1f} |")
    print(f"busy / idle tokens/s: {ratio:.2f} (target >= 0.5)")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / time.strftime("busy-core-%Y%m%d-%H%M%S.json", time.gmtime())
    path.write_text(json.dumps({"parameters": parameters, "max_tokens": args.max_tokens, "busy": args.busy,
                                "idle_s": idle, "busy_s": busy, "ratio": ratio}, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
