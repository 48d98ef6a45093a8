"""What `serve`'s HTTP guard (trtllm_model/launch/http_guard.py) costs, against tritonserver's own port, in one run.

    .venv/bin/python bench/http_guard.py                      # about a minute
    .venv/bin/python bench/http_guard.py --requests 400 --streams 32 --tokens 300

One server (synthetic executor, `--step-ms` steps) started by `trtllm-triton serve`; the same requests go to the
public HTTP port (the guard) and to tritonserver's loopback port behind it (read from its command line):
  - unary: `--requests` small POST /v2/models/ensemble/generate (1 token) one after another on one keep-alive
    connection, alternating between the two ports in blocks of 20 so that both meet the same moments of a noisy
    machine: latency p50 and mean, and the guard's CPU per request (the serve process's CPU time over the run).
  - streams: `--streams` generate_stream requests of `--tokens` tokens at once, each on its own connection,
    through each port in turn: wall time, SSE events (a response carries every token waiting for its stream, so
    their count varies), and the guard's CPU per event and per token (the serve process's CPU over each run).
  - the depth scan alone (http_guard.nested_deeper_than, run on a worker thread for a body over 64 KiB): its time
    on 2 MiB bodies made to cost the most (all brackets; short strings of brackets), best of 5.
Results: a table on stdout and bench/results/http_guard-<time>.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
from conftest import start_server  # noqa: E402

from trtllm_model.launch.http_guard import MAX_BODY_BYTES, MAX_JSON_DEPTH, nested_deeper_than  # noqa: E402

SMALL = json.dumps({"text_input": "hello", "max_tokens": 1}).encode()


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def triton_http_port(serve_pid: int) -> int:
    """The --http-port of the tritonserver that `serve` (serve_pid) started."""
    children = subprocess.run(["ps", "--ppid", str(serve_pid), "-o", "args="], capture_output=True, text=True).stdout
    for line in children.splitlines():
        if "tritonserver" in line:
            return int(next(a for a in line.split() if a.startswith("--http-port=")).split("=", 1)[1])
    raise RuntimeError(f"no tritonserver under pid {serve_pid}")


def unary(port: int, count: int, connection: http.client.HTTPConnection | None = None) -> list[float]:
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        connection.request("POST", "/v2/models/ensemble/generate", SMALL)
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
        times.append(time.perf_counter() - start)
    return times


def streams(port: int, count: int, tokens: int) -> tuple[float, int]:
    """Wall seconds for `count` streams of `tokens` tokens at once, and the SSE events they read."""
    body = json.dumps({"text_input": "hello", "max_tokens": tokens, "min_tokens": tokens, "stream": True}).encode()
    events = [0] * count

    def one(i: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request("POST", "/v2/models/ensemble/generate_stream", body)
        response = connection.getresponse()
        for line in response:
            events[i] += line.startswith(b"data:")
        connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, sum(events)


def depth_scan_ms() -> dict[str, float]:
    bodies = {"2 MiB of []": b"[]" * (MAX_BODY_BYTES // 2), '2 MiB of "[",': b'"[",' * (MAX_BODY_BYTES // 4)}
    times = {}
    for name, body in bodies.items():
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            nested_deeper_than(body, MAX_JSON_DEPTH)
            runs.append(time.perf_counter() - start)
        times[name] = min(runs) * 1e3
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="unary requests per port")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        server = start_server(Path(workdir), executor="synthetic",
                              parameters={"synthetic_step_ms": str(args.step_ms),
                                          "max_batch_size": str(max(64, args.streams))})
        try:
            ports = {"guard": server.http_port, "direct": triton_http_port(server.process.pid)}
            connections = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                           for name, port in ports.items()}
            for name, port in ports.items():  # warm-up
                unary(port, 20, connections[name])
            latency: dict[str, list[float]] = {"guard": [], "direct": []}
            cpu_before = cpu_s(server.process.pid)
            guard_cpu = 0.0
            for _ in range(args.requests // 20):
                for name, port in ports.items():
                    before = cpu_s(server.process.pid)
                    latency[name] += unary(port, 20, connections[name])
                    if name == "guard":
                        guard_cpu += cpu_s(server.process.pid) - before
            direct_cpu = cpu_s(server.process.pid) - cpu_before - guard_cpu  # serve's idle CPU over as long
            stream_runs = {}
            for name, port in ports.items():
                before = cpu_s(server.process.pid)
                wall, events = streams(port, args.streams, args.tokens)
                stream_runs[name] = {"wall_s": wall, "events": events, "serve_cpu_s": cpu_s(server.process.pid) - before}
        finally:
            server.stop()
    result = {
        "unary": {name: {"p50_ms": statistics.median(t) * 1e3, "mean_ms": statistics.fmean(t) * 1e3, "n": len(t)}
                  for name, t in latency.items()},
        "guard_cpu_us_per_request": (guard_cpu - direct_cpu) / len(latency["guard"]) * 1e6,
        "streams": stream_runs,
        "guard_cpu_us_per_event": (stream_runs["guard"]["serve_cpu_s"] - stream_runs["direct"]["serve_cpu_s"])
        / max(1, stream_runs["guard"]["events"]) * 1e6,
        "guard_cpu_us_per_token": (stream_runs["guard"]["serve_cpu_s"] - stream_runs["direct"]["serve_cpu_s"])
        / (args.streams * args.tokens) * 1e6,
        "depth_scan_ms": depth_scan_ms(),
        "args": vars(args),
    }
    print(f"{'':8}{'p50 ms':>9}{'mean ms':>9}")
    for name, row in result["unary"].items():
        print(f"{name:8}{row['p50_ms']:9.3f}{row['mean_ms']:9.3f}")
    print(f"unary: guard/direct p50 {result['unary']['guard']['p50_ms'] / result['unary']['direct']['p50_ms']:.2f}x, "
          f"+{result['unary']['guard']['p50_ms'] - result['unary']['direct']['p50_ms']:.3f} ms; "
          f"guard CPU {result['guard_cpu_us_per_request']:.0f} us per request")
    for name, run in stream_runs.items():
        print(f"streams {name:7} {run['wall_s']:.2f} s, {run['events']} events, serve CPU {run['serve_cpu_s']:.2f} s")
    print(f"streams: guard/direct wall {stream_runs['guard']['wall_s'] / stream_runs['direct']['wall_s']:.2f}x; "
          f"guard CPU {result['guard_cpu_us_per_event']:.1f} us per SSE event, "
          f"{result['guard_cpu_us_per_token']:.1f} us per token")
    for name, ms in result["depth_scan_ms"].items():
        print(f"depth scan of {name}: {ms:.1f} ms")
    out = BENCH_DIR / "results" / f"http_guard-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
