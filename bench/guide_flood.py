"""What a flood of slow guides costs other clients of the embedded engine (the CPU layout: the stub compiles guides).

    .venv/bin/python bench/guide_flood.py [--slow 40] [--samples 5]

Starts `trtllm-triton serve --executor transformers` with a 40-request bound (max_batch_size 8 + max_queue_size 32,
as tests/test_e2e_guided.py). Victims, measured alone first and then beside the flood, each on a gRPC stream of its
own: an unguided 2-token request, and a small guided one (a distinct `[0-9]+` regex each time, so it compiles every
time). The flood: `--slow` distinct JSON schemas that pass the guide checks and take about 1.4 s each to compile
(a `maxLength` string), sent at once; the victims go 0.5 s later, one after another, `--samples` times. Prints each
victim's median time to first response alone and beside the flood and their ratio, the flood's outcomes, and how
long the server's processes kept a core busy after the flood's last answer (compilations nobody waits for).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import start_server  # noqa: E402
from triton_client import StreamClient, token_inputs  # noqa: E402

PARAMETERS = {"max_batch_size": "8", "max_queue_size": "32"}


def guide(guide_type: str, text: str) -> dict:
    return {"guided_decoding_guide_type": ([[guide_type.encode()]], np.object_),
            "guided_decoding_guide": ([[text.encode()]], np.object_)}


def slow_schema(max_length: int) -> str:
    return json.dumps({"type": "object", "properties": {"note": {"type": "string", "maxLength": max_length}},
                       "required": ["note"]})


def first_response_s(url: str, inputs: list, name: str) -> float:
    """Seconds to the request's first response (or its refusal, which fails the run)."""
    client = StreamClient(url)
    try:
        started = time.monotonic()
        result = client.send("tensorrt_llm", inputs, name)
        while not result.responses and not result.errors:
            time.sleep(0.001)
        seconds = time.monotonic() - started
        result.wait(120)
        if result.errors:
            raise SystemExit(f"victim {name} refused: {result.errors[0]}")
        return seconds
    finally:
        client.close()


def victims(url: str, round_: int, index: int) -> dict[str, float]:
    return {
        "unguided": first_response_s(url, token_inputs([1, 504, 3575 + index], 2), f"u{round_}-{index}"),
        "small guide": first_response_s(url, token_inputs([1, 504, 3576], 2, **guide(
            "regex", f"[0-9]+{'a' * (round_ * 100 + index)}?")), f"g{round_}-{index}"),
    }


def busy_cores(processes: list[psutil.Process], seconds: float) -> float:
    before = sum(p.cpu_times().user + p.cpu_times().system for p in processes)
    time.sleep(seconds)
    return (sum(p.cpu_times().user + p.cpu_times().system for p in processes) - before) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=40)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    server = start_server(Path(tempfile.mkdtemp(prefix="guide-flood-")), executor="transformers", parameters=PARAMETERS)
    try:
        url = server.grpc_url
        victims(url, 0, 0)  # warm: xgrammar loaded, the compiler made
        alone = [victims(url, 1, i) for i in range(args.samples)]
        beside, outcomes, after = [], {}, []
        for sample in range(args.samples):
            flood = StreamClient(url)
            results = [flood.send("tensorrt_llm", token_inputs([1, 2, 3], 4, **guide(
                "json_schema", slow_schema(500 + 100 * sample + n))), f"slow{n}") for n in range(args.slow)]
            time.sleep(0.5)
            beside.append(victims(url, 2 + sample, 0))
            for result in results:
                result.wait(300)
                reason = (result.errors[0].split(":")[0] + (" busy" if "busy" in result.errors[0] else " too slow"
                          if "timeout" in result.errors[0] else "")) if result.errors else "served"
                outcomes[reason] = outcomes.get(reason, 0) + 1
            flood.close()
            tree = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
            after.append(busy_cores(tree, 3.0))
        print(f"slow guides: {args.slow} x {args.samples} rounds: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
        for victim in ("unguided", "small guide"):
            quiet = statistics.median(s[victim] for s in alone)
            loaded = statistics.median(s[victim] for s in beside)
            print(f"{victim:12s} first response: alone {quiet * 1000:7.1f} ms, beside the flood {loaded * 1000:7.1f} ms"
                  f" ({loaded / quiet:.2f}x)")
        print("server's cores busy in the 3 s after each flood's last answer: "
              + ", ".join(f"{cores:.2f}" for cores in after))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
