"""Request churn through Triton with the synthetic executor (10 ms steps), as issue 32's e2e command makes it on a
GPU: STREAMS gRPC streams (2 client processes) each sending `ensemble` text requests of MAX_TOKENS tokens back to back,
measured for 8 s after 3 s of warm-up (bench/e2e.py's client). From the repository root:

    .venv/bin/python bench/results/cpu-request-churn-20261206.py STREAMS MAX_TOKENS
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

WARMUP_S, WINDOW_S, PROCS = 3.0, 8.0, 2


def main() -> None:
    streams, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    server = start_server(Path("/tmp/request-churn"), executor="synthetic", parameters={"max_batch_size": "512"})
    try:
        with ProcessPoolExecutor(max_workers=PROCS, mp_context=get_context("spawn")) as pool:
            list(pool.map(time.sleep, [0.5] * PROCS))
            start = time.monotonic() + 1.5
            w0, w1 = start + WARMUP_S, start + WARMUP_S + WINDOW_S
            plans = [e2e.Plan(server.grpc_url, streams // PROCS, p * 1000, e2e.questions(512), max_tokens, start, w0,
                              w1) for p in range(PROCS)]
            results = [future.result() for future in [pool.submit(e2e.run_worker, plan) for plan in plans]]
    finally:
        server.stop()
    ttft = sorted(t for r in results for t in r.ttft)
    tokens_s = sum(r.tokens for r in results) / WINDOW_S  # tokens, responses and TTFT: inside the window only
    print(f"streams {streams}, max_tokens {max_tokens}: requests/s {tokens_s / max_tokens:.0f} (tok/s / max_tokens),"
          f" responses/s {sum(r.responses for r in results) / WINDOW_S:.0f},"
          f" tok/s {tokens_s:.0f}, TTFT p50 {1000 * statistics.median(ttft):.1f} ms"
          f" p99 {1000 * ttft[int(0.99 * len(ttft))]:.1f} ms, errors {sum(len(r.errors) for r in results)}", flush=True)


if __name__ == "__main__":
    main()
