"""Request churn through Triton with the synthetic executor (cpu-request-churn-20261206.py), with the server's split of
the time to first token (bench/ttft_split.py) and the delivery timers (execute() calls included). From the repository
root:

    .venv/bin/python bench/results/cpu-request-churn-split-20261206.py STREAMS MAX_TOKENS [PARAMETER=VALUE...]
"""

import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path[:0] = ["bench", "tests", "."]
import e2e  # noqa: E402
from conftest import start_server  # noqa: E402
from ttft_split import describe, gauges, mean_gauges, snapshot, split  # noqa: E402

WARMUP_S, WINDOW_S, PROCS = 3.0, 8.0, 2


def main() -> None:
    streams, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    parameters = {"max_batch_size": "512", **dict(item.split("=", 1) for item in sys.argv[3:])}
    server = start_server(Path("/tmp/request-churn"), executor="synthetic", parameters=parameters,
                          env={"TRTLLM_DELIVERY_TIMING_S": "2"})
    try:
        with ProcessPoolExecutor(max_workers=PROCS, mp_context=get_context("spawn")) as pool:
            list(pool.map(time.sleep, [0.5] * PROCS))
            start = time.monotonic() + 1.5
            w0, w1 = start + WARMUP_S, start + WARMUP_S + WINDOW_S
            plans = [e2e.Plan(server.grpc_url, streams // PROCS, p * 1000, e2e.questions(512), max_tokens, start, w0,
                              w1) for p in range(PROCS)]
            futures = [pool.submit(e2e.run_worker, plan) for plan in plans]
            time.sleep(max(0.0, w0 - time.monotonic()))
            counted0, t0 = snapshot(server.http_url, server.metrics_url), time.monotonic()
            held = []
            while time.monotonic() < w1 - 0.6:
                time.sleep(0.5)
                held.append(gauges(server.metrics_url))
            time.sleep(max(0.0, w1 - time.monotonic()))
            counted1, t1 = snapshot(server.http_url, server.metrics_url), time.monotonic()
            results = [future.result() for future in futures]
    finally:
        server.stop()
    ttft = sorted(t for r in results for t in r.ttft)
    tokens_s = sum(r.tokens for r in results) / WINDOW_S
    print(f"streams {streams}, max_tokens {max_tokens} {sys.argv[3:]}: req/s {tokens_s / max_tokens:.0f}, "
          f"responses/s {sum(r.responses for r in results) / WINDOW_S:.0f}, TTFT p50 "
          f"{1000 * statistics.median(ttft):.1f} ms, errors {sum(len(r.errors) for r in results)}")
    print("  server:", describe(split(counted0, counted1, t1 - t0), mean_gauges(held)))
    print("\n".join([line for line in server.log().splitlines() if "delivery timing" in line][-3:]))


if __name__ == "__main__":
    main()
