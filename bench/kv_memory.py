"""Peak memory of the embedded engine with its KV block pool filled (issue 21): does the default budget fit the CPU
Deployment's 4 GiB limit (deploy/kubernetes/cpu/deployment.yaml)?

Builds the transformers executor from config parameters as the model does (defaults unless --param sets one), then
fills the pool: --streams requests of --prompt-tokens varied prompt tokens and --max-tokens new tokens each, all in
flight at once (what does not fit waits in the queue, as in the server). Prints the pool's size, the process's
resident memory when idle and its peak (VmHWM) over the run, and the peak against the limit.

Run: `.venv/bin/python bench/kv_memory.py` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.transformers_executor import create  # noqa: E402
from trtllm_model.params import Params  # noqa: E402

LIMIT_BYTES = 4 << 30  # the CPU Deployment's memory limit


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=1900)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--param", action="append", default=[], help="config parameter NAME=VALUE (repeatable)")
    args = parser.parse_args()
    params = dict(item.split("=", 1) for item in args.param)
    executor = create(Params(params, accepted=params.keys()))
    idle = status_bytes("VmRSS")
    vocab = executor.vocab_size
    started = time.monotonic()
    ids = [executor.enqueue(GenerationRequest(
        input_ids=[(7919 * (i + 1) * (j + 3)) % (vocab - 1) + 1 for j in range(args.prompt_tokens)],
        max_tokens=args.max_tokens, streaming=True, min_tokens=args.max_tokens)) for i in range(args.streams)]
    open_ids, peak_used, total_blocks = set(ids), 0, None
    while open_ids:
        for step in executor.await_steps(1.0):
            if step.is_final:
                open_ids.discard(step.request_id)
                assert step.error is None, step.error
        for stats in executor.iteration_stats():
            if stats.kv_cache is not None:
                peak_used, total_blocks = max(peak_used, stats.kv_cache.used_blocks), stats.kv_cache.max_blocks
    peak = status_bytes("VmHWM")
    executor.shutdown()
    result = {
        "params": params, "streams": args.streams, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
        "pool_blocks": total_blocks, "peak_used_blocks": peak_used,
        "idle_rss_mib": round(idle / 2**20), "peak_rss_mib": round(peak / 2**20),
        "peak_of_4gib_limit": round(peak / LIMIT_BYTES, 3), "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result, indent=2))
    return 0 if peak < LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
