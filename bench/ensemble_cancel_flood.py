"""What an open-and-cancel loop against `ensemble` does to other clients (issue 31 item 5).

    .venv/bin/python bench/ensemble_cancel_flood.py [--seconds 20] [--rows 64] [--max-tokens 2000] [--flooders 1]
    .venv/bin/python bench/ensemble_cancel_flood.py --model tensorrt_llm --stop-row --no-cancel   # a `stop` row
    .venv/bin/python bench/ensemble_cancel_flood.py --cancel-once --rows 1 --max-tokens 400 --executor transformers

Starts `trtllm-triton serve --executor EXECUTOR` (`--executor`, default synthetic; the project repository: `ensemble`
is a one-step Triton ensemble over `tensorrt_llm`). `--flooders` threads each loop: open a gRPC stream, send one `ensemble` request of `--rows`
rows with `--max-tokens`, wait for its first response, cancel the call (as `stop_stream(cancel_requests=True)`).
Triton passes an ensemble's cancellation only to steps it starts later, so `tensorrt_llm` never hears of it.
Meanwhile a victim sends one 8-token `tensorrt_llm` request every 0.1 s and records whether it was served and its
time to last token; the model's `nv_llm_open_requests` is sampled each second. Prints a summary; `--json` writes it.
`--model tensorrt_llm` sends the flood there directly; `--stop-row` makes its row 0 a `stop` (for an id not in flight).
`--cancel-once`: no flood, no victim; one request of `--rows` rows, cancelled at its first response; prints how long
after the cancel its rows ended, how (finish reasons) and the tokens generated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import start_server  # noqa: E402
from prometheus_text import scrape  # noqa: E402
from triton_client import StreamClient, stream_once, tensor, token_inputs  # noqa: E402


def ensemble_rows(rows: int, max_tokens: int, stop_row: bool = False) -> list:
    inputs = [
        tensor("text_input", [[f"flood {i}".encode()] for i in range(rows)], np.object_),
        tensor("max_tokens", [[max_tokens]] * rows, np.int32),
        tensor("stream", [[True]] * rows, np.bool_),
    ]
    if stop_row:
        inputs.append(tensor("stop", [[i == 0] for i in range(rows)], np.bool_))
    return inputs


def flood(url: str, rows: int, max_tokens: int, stop: threading.Event, counts: dict, cancel: bool,
          model: str = "ensemble", stop_row: bool = False) -> None:
    while not stop.is_set():
        client = StreamClient(url)
        try:
            result = client.send(model, ensemble_rows(rows, max_tokens, stop_row), f"flood-{counts['sent']}")
            counts["sent"] += 1
            deadline = time.monotonic() + 5
            while not result.responses and not result.errors and time.monotonic() < deadline:
                time.sleep(0.005)
            counts["refused" if result.errors else "started"] += 1
            if cancel:
                client.cancel()
            else:  # the comparison: a client that keeps its request to its end (one final for all its rows)
                result.wait(600)
        finally:
            client.close()


def victim(url: str, stop: threading.Event, outcomes: list) -> None:
    while not stop.is_set():
        started = time.monotonic()
        result = stream_once(url, "tensorrt_llm", token_inputs([7], 8), timeout_s=30)
        outcomes.append((result.errors[0][:60] if result.errors else None, time.monotonic() - started))
        time.sleep(0.1)


def finished_by_reason(metrics_url: str) -> dict[str, float]:
    found = scrape(metrics_url).find("nv_llm_requests_finished_total", model="tensorrt_llm")
    return {dict(key)["finish_reason"]: value for key, value in found.items()}


def cancel_once(rows: int, max_tokens: int, model: str, executor: str, parameters: dict[str, str]) -> dict:
    """The rows' finish, read from the model's counters (its open-requests gauge is refreshed every 0.1 s, so right
    after a fast first response it may not show the request yet)."""
    with tempfile.TemporaryDirectory(prefix="ensemble-cancel-") as workdir:
        server = start_server(Path(workdir), executor=executor, parameters=parameters)
        try:
            before = finished_by_reason(server.metrics_url)
            tokens_before = scrape(server.metrics_url).value("nv_llm_generation_tokens_total", model="tensorrt_llm")
            client = StreamClient(server.grpc_url)
            started = time.monotonic()
            result = client.send(model, ensemble_rows(rows, max_tokens), "cancelled")
            while not result.responses and not result.errors:
                time.sleep(0.005)
            client.cancel()
            cancelled = time.monotonic()
            client.close()
            while True:
                now = finished_by_reason(server.metrics_url)
                delta = {reason: int(now[reason] - before.get(reason, 0)) for reason in now}
                if sum(delta.values()) >= rows or time.monotonic() - cancelled > 600:
                    break
                time.sleep(0.1)
            ended_s = time.monotonic() - cancelled
            tokens = scrape(server.metrics_url).value("nv_llm_generation_tokens_total", model="tensorrt_llm")
        finally:
            server.stop()
    return {"rows": rows, "max_tokens": max_tokens, "model": model, "executor": executor, "parameters": parameters,
            "first_response_s": round(cancelled - started, 2), "rows_ended_after_cancel_s": round(ended_s, 1),
            "finish_reasons": {reason: n for reason, n in delta.items() if n},
            "tokens_generated": int(tokens - tokens_before)}


def run(seconds: float, rows: int, max_tokens: int, flooders: int, parameters: dict[str, str],
        cancel: bool = True, model: str = "ensemble", stop_row: bool = False, executor: str = "synthetic") -> dict:
    with tempfile.TemporaryDirectory(prefix="ensemble-flood-") as workdir:
        server = start_server(Path(workdir), executor=executor, parameters=parameters)
        try:
            stop, counts, outcomes, open_samples = threading.Event(), {"sent": 0, "started": 0, "refused": 0}, [], []
            baseline: list = []
            base_stop = threading.Event()
            base = threading.Thread(target=victim, args=(server.grpc_url, base_stop, baseline))
            base.start()
            time.sleep(3)
            base_stop.set()
            base.join()
            threads = [threading.Thread(target=flood, args=(server.grpc_url, rows, max_tokens, stop, counts, cancel,
                                                            model, stop_row)) for _ in range(flooders)]
            threads.append(threading.Thread(target=victim, args=(server.grpc_url, stop, outcomes)))
            for thread in threads:
                thread.start()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                open_samples.append(scrape(server.metrics_url).value("nv_llm_open_requests", model="tensorrt_llm"))
                time.sleep(1)
            stop.set()
            for thread in threads:
                thread.join()
            drained_at = time.monotonic()
            while scrape(server.metrics_url).value("nv_llm_open_requests", model="tensorrt_llm") and \
                    time.monotonic() - drained_at < 120:
                time.sleep(0.5)
            drain_s = time.monotonic() - drained_at
        finally:
            server.stop()
    served = [seconds for error, seconds in outcomes if error is None]
    refusals: dict[str, int] = {}
    for error, _ in outcomes:
        if error is not None:
            refusals[error] = refusals.get(error, 0) + 1
    return {
        "rows": rows, "max_tokens": max_tokens, "flooders": flooders, "cancel": cancel, "seconds": seconds, "parameters": parameters,
        "model": model, "stop_row": stop_row, "executor": executor,
        "flood_requests": counts,
        "victim_alone_p50_s": statistics.median(s for _, s in baseline),
        "victim_requests": len(outcomes), "victim_served": len(served),
        "victim_p50_s": statistics.median(served) if served else None,
        "victim_max_s": max(served) if served else None,
        "victim_refusals": refusals,
        "open_requests_peak": max(open_samples), "open_requests_samples": open_samples,
        "drain_after_flood_s": round(drain_s, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--flooders", type=int, default=1)
    parser.add_argument("--param", action="append", default=[], help="tensorrt_llm parameter key=value")
    parser.add_argument("--no-cancel", action="store_true", help="flooders keep their requests to the end")
    parser.add_argument("--model", choices=["ensemble", "tensorrt_llm"], default="ensemble")
    parser.add_argument("--stop-row", action="store_true", help="row 0 of each flood request is a `stop`")
    parser.add_argument("--cancel-once", action="store_true", help="one request, cancelled at its first response")
    parser.add_argument("--executor", default="synthetic", help="the engine")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parameters = dict(p.split("=", 1) for p in args.param)
    if args.cancel_once:
        report = cancel_once(args.rows, args.max_tokens, args.model, args.executor, parameters)
    else:
        report = run(args.seconds, args.rows, args.max_tokens, args.flooders, parameters, cancel=not args.no_cancel,
                     model=args.model, stop_row=args.stop_row, executor=args.executor)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
