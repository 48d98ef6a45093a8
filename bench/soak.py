"""Soak: many short requests through the real server; no lost or duplicated final response, no memory growth.

    .venv/bin/python bench/soak.py [--requests 20000] [--concurrency 64] [--tokens 4]

Starts tritonserver with the synthetic executor, keeps `--concurrency` requests in flight over 8 gRPC streams,
checks every request's tokens and that it got exactly one final response, and samples the resident memory of
the `tensorrt_llm` stub process after a quarter of the requests and at the end. Target (issue: 20,000 requests
at 64 streams): growth under 50 MB, zero lost, zero duplicated, zero requests left open in the model.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import Server, start_server  # noqa: E402
from triton_client import StreamClient, token_inputs  # noqa: E402

from trtllm_model.executors.synthetic import synthetic_token  # noqa: E402

STREAMS = 8


@dataclass
class SoakReport:
    completed: int = 0
    wrong_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated_finals: int = 0
    rss_samples: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0


def stub_rss_bytes(server: Server) -> int:
    """Resident memory of the Python stub serving `tensorrt_llm`."""
    for child in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if "tensorrt_llm" in " ".join(child.cmdline()) and "stub" in child.name():
                return child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    raise RuntimeError("no tensorrt_llm stub process found")


def run_soak(server: Server, requests: int, concurrency: int, tokens: int, sample_at: int) -> SoakReport:
    report, lock = SoakReport(), threading.Lock()
    clients = [StreamClient(server.grpc_url) for _ in range(STREAMS)]
    next_index = iter(range(requests))
    started = time.monotonic()

    def worker(slot: int) -> None:
        client = clients[slot % STREAMS]
        for index in next_index:  # shared iterator: each request index is taken once
            ids = [index % 30000 + 1]
            result = client.send("tensorrt_llm", token_inputs(ids, tokens), f"q{index}")
            if not result.done.wait(60):
                with lock:
                    report.lost += 1
                continue
            time.sleep(0)  # let a duplicate final (if any) land before we count
            with lock:
                report.completed += 1
                if result.errors:
                    report.errors.append(result.errors[0])
                elif result.tokens() != [synthetic_token(ids, i, 32000) for i in range(tokens)]:
                    report.wrong_tokens += 1
                if report.completed == sample_at:
                    report.rss_samples[sample_at] = stub_rss_bytes(server)
            client.results.pop(f"q{index}", None)
            if result.finals > 1:
                with lock:
                    report.duplicated_finals += 1

    workers = [threading.Thread(target=worker, args=(slot,)) for slot in range(concurrency)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    report.seconds = time.monotonic() - started
    time.sleep(0.5)  # a late duplicate would arrive now; count it
    for client in clients:
        report.duplicated_finals += sum(1 for r in client.results.values() if r.finals > 1)
        client.close()
    report.rss_samples[requests] = stub_rss_bytes(server)
    return report


def open_requests_in_model(server: Server) -> float | None:
    """The model's own count of requests it holds (nv_llm_open_requests), read from /metrics."""
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("nv_llm_open_requests{") and 'model="tensorrt_llm"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        server = start_server(Path(workdir), parameters={"synthetic_step_ms": "2", "max_batch_size": "128"})
        try:
            report = run_soak(server, args.requests, args.concurrency, args.tokens, sample_at=args.requests // 4)
            time.sleep(0.5)  # one metrics flush
            open_left = open_requests_in_model(server)
        finally:
            server.stop()
    first, last = sorted(report.rss_samples)
    growth_mb = (report.rss_samples[last] - report.rss_samples[first]) / 2**20
    print(f"{report.completed} requests in {report.seconds:.1f} s ({report.completed / report.seconds:.0f}/s), "
          f"{args.concurrency} in flight over {STREAMS} gRPC streams, {args.tokens} tokens each")
    print(f"lost: {report.lost}  duplicated finals: {report.duplicated_finals}  errors: {len(report.errors)}  "
          f"wrong tokens: {report.wrong_tokens}  open in the model afterwards: {open_left}")
    print(f"stub RSS after {first} requests: {report.rss_samples[first] / 2**20:.1f} MB, after {last}: "
          f"{report.rss_samples[last] / 2**20:.1f} MB, growth {growth_mb:+.1f} MB (target < 50 MB)")
    ok = (report.lost == report.duplicated_finals == report.wrong_tokens == 0 and not report.errors
          and growth_mb < 50 and open_left in (0.0, None))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
