"""The OpenAI frontend's cost over direct gRPC, measured in one run against one server.

    .venv/bin/python bench/openai.py                     # about a minute
    .venv/bin/python bench/openai.py --ttft-requests 400 --streams 64 --window 10 --rounds 2

One server (synthetic executor, `--step-ms` steps, every stream active at once) with its OpenAI frontend, as
`trtllm-triton serve` starts them. Two measurements, each comparing the same requests made two ways:
  - time to first token at one stream: 1-token requests one after another, alternating between direct gRPC (one
    `ModelStreamInfer` call carrying them all, bench/aio_client.py's probe requests) and the frontend
    (`POST /v1/completions` with the same token ids, stream=true, on one keep-alive connection; the time to the
    first SSE chunk with text). Alternating puts both through the same moments of a noisy machine.
    Target: the frontend's p50 at most 1 ms above direct gRPC.
  - delivered tokens/s at `--streams` streams: for `--window` seconds, long requests on every stream, direct
    (bench/aio_client.py's load streams, tokens checked) then through the frontend (SSE chunks; each synthetic
    token above 255 is one word " w<id>", so words are tokens); `--rounds` times, alternating.
    Target: the frontend at least 0.9x direct gRPC.

The HTTP client is a few lines of asyncio (HTTP/1.1, chunked SSE), so its own cost stays near that of the gRPC
client. Results: a table on stdout and bench/results/openai-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(BENCH_DIR))
from aio_client import VOCAB_SIZE, Plan, _request, run_worker  # noqa: E402
from openai_server import start_openai_server  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

RESULTS = BENCH_DIR / "results"
MODEL = "tensorrt_llm"


# -- a small HTTP/1.1 SSE client ---------------------------------------------------------------------------------
class SseConnection:
    """One keep-alive connection; `post` sends a streamed completion and yields each SSE event's JSON."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: dict):
        payload = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        )
        status = await self.reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"HTTP {status.decode().strip()}")
        chunked = False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"transfer-encoding: chunked"):
                chunked = True
        if not chunked:
            raise RuntimeError("expected a chunked SSE response")
        buffer = b""
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                await self.reader.readline()
                return
            buffer += await self.reader.readexactly(size)
            await self.reader.readexactly(2)
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event[len(b"data: "):]
                if data != b"[DONE]":
                    yield json.loads(data)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _completion(last_input_id: int, max_tokens: int) -> dict:
    return {"model": MODEL, "prompt": [7, last_input_id], "max_tokens": max_tokens, "stream": True}


# -- time to first token, alternating ----------------------------------------------------------------------------
async def alternating_ttft(grpc_url: str, host: str, port: int, requests: int, warmup: int) -> tuple[list, list]:
    channel = grpc.aio.insecure_channel(grpc_url)
    call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
    http = SseConnection(host, port)
    await http.open()
    direct, frontend = [], []
    try:
        for number in range(requests + warmup):
            last = 300 + number % 1000  # a word token follows: its text is never empty
            sent = time.monotonic()
            await call.write(_request(MODEL, f"ttft-{number}", last, 1))
            first = None
            while True:
                message = await call.read()
                if message.error_message:
                    raise RuntimeError(message.error_message)
                response = message.infer_response
                if first is None and response.outputs:
                    first = time.monotonic()
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
            got_direct = first - sent

            sent = time.monotonic()
            first = None
            async for event in http.post("/v1/completions", _completion(last, 1)):
                if first is None and event.get("choices") and event["choices"][0]["text"]:
                    first = time.monotonic()
            if number >= warmup:
                direct.append(got_direct)
                frontend.append(first - sent)
    finally:
        call.cancel()
        await channel.close()
        await http.close()
    return direct, frontend


# -- delivered tokens/s ------------------------------------------------------------------------------------------
async def frontend_throughput(host: str, port: int, streams: int, max_tokens: int, start: float, w0: float,
                              w1: float) -> tuple[int, list[str]]:
    counted = [0]
    errors: list[str] = []

    async def one(index: int) -> None:
        http = SseConnection(host, port)
        await http.open()
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        try:
            async for event in http.post("/v1/completions", _completion(1000 + index * 97 % VOCAB_SIZE, max_tokens)):
                now = time.monotonic()
                if now >= w1:
                    break
                if w0 <= now and event.get("choices"):
                    counted[0] += event["choices"][0]["text"].count(" w")
        except Exception as exc:  # noqa: BLE001 - reported with the results
            errors.append(f"stream {index}: {type(exc).__name__}: {exc}")
        finally:
            await http.close()  # a disconnect: the frontend cancels the Triton request

    await asyncio.gather(*(one(i) for i in range(streams)))
    return counted[0], errors


def _window(args) -> tuple[float, float, float, int]:
    start = time.monotonic() + 1.0
    w0 = start + args.warmup
    w1 = w0 + args.window
    max_tokens = int((args.warmup + args.window + 6.0) * 1000.0 / args.step_ms)
    return start, w0, w1, max_tokens


def wait_idle(server_url_metrics: str, timeout_s: float = 30.0) -> None:
    """Until the model holds no request (the previous phase's streams were cancelled)."""
    from prometheus_text import scrape

    deadline = time.monotonic() + timeout_s
    while scrape(server_url_metrics).value("nv_llm_open_requests", model=MODEL) and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--ttft-requests", type=int, default=300)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    parameters = {"synthetic_step_ms": str(args.step_ms), "max_batch_size": str(max(64, args.streams)),
                  "max_queue_size": "256"}
    with tempfile.TemporaryDirectory(prefix="bench-openai-") as workdir:
        server, base_url = start_openai_server(Path(workdir), "synthetic", parameters)
        host, port = "127.0.0.1", int(base_url.rsplit(":", 1)[1].split("/")[0])
        try:
            direct, frontend = asyncio.run(alternating_ttft(server.grpc_url, host, port, args.ttft_requests, 20))
            rates = {"direct": [], "frontend": []}
            errors: list[str] = []
            for _ in range(args.rounds):
                wait_idle(server.metrics_url)
                start, w0, w1, max_tokens = _window(args)
                plan = Plan(url=server.grpc_url, model=MODEL, load_streams=args.streams, load_tokens=max_tokens,
                            probe=False, probe_tokens=1, probe_pause_s=0.0, start=start, w0=w0, w1=w1,
                            step_s=args.step_ms / 1000.0, first_input_id=1000)
                result = run_worker(plan)
                rates["direct"].append(result.tokens / args.window)
                errors += result.errors
                wait_idle(server.metrics_url)
                start, w0, w1, max_tokens = _window(args)
                tokens, failures = asyncio.run(
                    frontend_throughput(host, port, args.streams, max_tokens, start, w0, w1))
                rates["frontend"].append(tokens / args.window)
                errors += failures
        except BaseException:
            print(f"the run stopped; the server's log ends:\n{server.log()[-6000:]}", file=sys.stderr)
            raise
        finally:
            server.stop()

    p50_direct, p50_frontend = statistics.median(direct), statistics.median(frontend)
    tps_direct, tps_frontend = statistics.fmean(rates["direct"]), statistics.fmean(rates["frontend"])
    ideal = args.streams * 1000.0 / args.step_ms
    report = {
        "ttft_p50_ms": {"direct": p50_direct * 1e3, "frontend": p50_frontend * 1e3},
        "ttft_p50_added_ms": (p50_frontend - p50_direct) * 1e3,
        "ttft_quartiles_ms": {name: [q * 1e3 for q in statistics.quantiles(values, n=4)]
                              for name, values in (("direct", direct), ("frontend", frontend))},
        "tokens_per_s": {"direct": rates["direct"], "frontend": rates["frontend"], "ideal": ideal},
        "tokens_per_s_ratio": tps_frontend / tps_direct if tps_direct else None,
        "errors": errors[:20],
        "args": vars(args),
    }
    print(f"time to first token p50, 1 stream:   direct gRPC {p50_direct * 1e3:7.2f} ms   "
          f"OpenAI frontend {p50_frontend * 1e3:7.2f} ms   added {report['ttft_p50_added_ms']:+.2f} ms  (target <= +1 ms)")
    print(f"delivered tokens/s, {args.streams} streams:  direct gRPC {tps_direct:7.0f}      OpenAI frontend "
          f"{tps_frontend:7.0f}      ratio {report['tokens_per_s_ratio']:.3f}   (target >= 0.9; engine pace {ideal:.0f})")
    if errors:
        print(f"errors ({len(errors)}): {errors[:5]}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"openai-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"results: {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
