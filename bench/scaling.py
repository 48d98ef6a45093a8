"""The scaling signal against offered load, on one replica: does it rise with the load and cross its target before
time to first token (TTFT) degrades?

    .venv/bin/python bench/scaling.py                       # the defaults below, about 2 minutes
    .venv/bin/python bench/scaling.py --streams 2,8,16,24,32 --window 8
    .venv/bin/python bench/scaling.py --executor transformers --streams 1,2,4,8 --prompt-tokens 32 --max-tokens 16 \
        --window 15 --target 0.06

One server (`trtllm-triton serve`, synthetic executor) with a paged KV cache: max_tokens_in_paged_kv_cache=4096 at
32 tokens per block = 128 blocks. Each request has a 96-token prompt and asks for 160 tokens at 10 ms per step,
so it holds 3 to 8 blocks as it grows and is admitted only while 8 blocks per admitted request are free (TensorRT-
LLM's GUARANTEED_NO_EVICT policy): 16 requests run at once, more wait. The offered load is a number of concurrent
streams, each sending its next request as soon as the previous one ends (closed loop). At each level, after a warm
up, the window's requests give TTFT (client side, gRPC) and Prometheus scrapes of the server give the signal:

  KV-cache demand = kv_cache_block_metrics{fraction} + queued / active      (the GPU variant's HPA)
  batch demand    = active / max_batch_size + queued / active                (the CPU variant's HPA)
                    (deploy/kubernetes/autoscaling/prometheus-rule.yaml records both per pod)

and, beside them, NVIDIA's autoscaling signal (queue time over compute time, Triton's own counters for the model),
to show what it does for a decoupled model. `--executor transformers` runs the embedded SmolLM2 engine on CPU
instead (max_batch_size and the rest from the model repository) and judges the batch demand. Passes when the judged
signal rises at every level and reaches --target at a level whose TTFT (median and 90th percentile) is at most 2x
the lightest level's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import grpc  # noqa: E402
from conftest import start_server  # noqa: E402
from prometheus_text import Scrape, scrape  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

PARAMETERS = {
    "max_tokens_in_paged_kv_cache": "4096",
    "synthetic_tokens_per_block": "32",
    "synthetic_step_ms": "10",
    "max_batch_size": "64",
    "stats_check_period_ms": "100",
}
MODEL = {"model": "tensorrt_llm", "version": "1"}
STEP_S = 0.010


def kv_cache_demand(s: Scrape) -> float:
    """The recording rule trtllm:kv_cache_demand:ratio, computed from one scrape of one replica."""
    fraction = s.value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction", **MODEL)
    active = s.value("nv_trt_llm_request_metrics", request_type="active", **MODEL)
    queued = s.value("nv_llm_queued_requests", **MODEL)
    return fraction + queued / max(active, 1.0)


def batch_demand(s: Scrape) -> float:
    """The recording rule trtllm:batch_demand:ratio, computed from one scrape of one replica."""
    active = s.value("nv_trt_llm_request_metrics", request_type="active", **MODEL)
    most = s.value("nv_trt_llm_request_metrics", request_type="max", **MODEL)
    queued = s.value("nv_llm_queued_requests", **MODEL)
    return active / most + queued / max(active, 1.0)


def triton_counter(s: Scrape, name: str) -> float:
    return s.value(name, model="tensorrt_llm", version="1")


@dataclass
class Level:
    streams: int
    ttft: list[float] = field(default_factory=list)
    finished: int = 0
    demand: list[float] = field(default_factory=list)
    batch: list[float] = field(default_factory=list)
    fraction: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)
    queue_compute: float = 0.0
    errors: list[str] = field(default_factory=list)


def request(number: int, prompt_tokens: int, max_tokens: int) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="tensorrt_llm", id=f"r{number}")
    prompt = [(number * 7 + i) % 30000 + 1 for i in range(prompt_tokens)]
    for name, shape, values in (("input_ids", [1, prompt_tokens], prompt), ("request_output_len", [1, 1], [max_tokens]),
                                ("streaming", [1, 1], None)):
        tensor = message.inputs.add(name=name, datatype="BOOL" if values is None else "INT32")
        tensor.shape.extend(shape)
        message.raw_input_contents.append(b"\x01" if values is None else b"".join(v.to_bytes(4, "little") for v in values))
    return message


async def user(stub, index: int, args, level: Level, window: tuple[float, float], stop: float) -> None:
    """One stream: requests back to back until `stop`; TTFT of those sent inside the window."""
    call = stub.ModelStreamInfer()
    number = index * 100_000
    # Staggered starts: streams that all began together would finish together and arrive in waves.
    await asyncio.sleep(index / level.streams * args.max_tokens * STEP_S)
    try:
        while time.monotonic() < stop:
            sent, first = time.monotonic(), None
            await call.write(request(number, args.prompt_tokens, args.max_tokens))
            number += 1
            while True:
                message = await call.read()
                if message is grpc.aio.EOF or message.error_message:
                    raise RuntimeError(message.error_message if message is not grpc.aio.EOF else "stream ended")
                if first is None and message.infer_response.outputs:
                    first = time.monotonic()
                final = message.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
            if window[0] <= sent < window[1]:
                level.ttft.append(first - sent)
                level.finished += 1
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 - counted, so one failing stream does not hide the others
        level.errors.append(f"stream {index}: {exc}")
    finally:
        call.cancel()


async def sample(metrics_url: str, level: Level, window: tuple[float, float]) -> None:
    """Scrape through the window: the signal as Prometheus would see it, and Triton's queue/compute counters."""
    await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
    first = await asyncio.to_thread(scrape, metrics_url)
    last = first
    while time.monotonic() < window[1]:
        last = await asyncio.to_thread(scrape, metrics_url)
        level.demand.append(kv_cache_demand(last))
        level.batch.append(batch_demand(last))
        level.fraction.append(last.value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction", **MODEL))
        level.queued.append(last.value("nv_llm_queued_requests", **MODEL))
        await asyncio.sleep(0.25)
    queue_us = triton_counter(last, "nv_inference_queue_duration_us") - triton_counter(first, "nv_inference_queue_duration_us")
    compute_us = (triton_counter(last, "nv_inference_compute_infer_duration_us")
                  - triton_counter(first, "nv_inference_compute_infer_duration_us"))
    level.queue_compute = queue_us / max(compute_us, 1.0)  # NVIDIA's clamp_min(..., 1)


async def run_level(server, streams: int, args) -> Level:
    level = Level(streams)
    now = time.monotonic()
    window = (now + args.warmup, now + args.warmup + args.window)
    channels = [grpc.aio.insecure_channel(server.grpc_url) for _ in range(4)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
    tasks = [asyncio.ensure_future(user(stubs[i % 4], i, args, level, window, window[1])) for i in range(streams)]
    await sample(server.metrics_url, level, window)
    await asyncio.wait(tasks, timeout=args.max_tokens * STEP_S * 4 + 10)  # the last requests end on their own
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    await asyncio.sleep(1.0)  # the server drains before the next level
    return level


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executor", default="synthetic", choices=("synthetic", "transformers"))
    parser.add_argument("--streams", default="1,4,8,12,16,20,24,32", help="offered load: concurrent streams per level")
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds before each level's window")
    parser.add_argument("--window", type=float, default=8.0, help="seconds measured per level")
    parser.add_argument("--target", type=float, default=0.5, help="the HPA's target for the signal (deploy/kubernetes)")
    parser.add_argument("--signal", choices=("kv", "batch"), help="the signal judged (default: kv for synthetic, "
                        "batch for transformers, as the GPU and CPU HPAs)")
    args = parser.parse_args()
    args.signal = args.signal or ("kv" if args.executor == "synthetic" else "batch")

    with tempfile.TemporaryDirectory(prefix="scaling-") as workdir:
        parameters = PARAMETERS if args.executor == "synthetic" else {"stats_check_period_ms": "100"}
        server = start_server(Path(workdir), executor=args.executor, parameters=parameters, models=("tensorrt_llm",))
        try:
            levels = [asyncio.run(run_level(server, int(n), args)) for n in args.streams.split(",")]
        finally:
            server.stop()

    engine = ("synthetic executor, KV cache 128 blocks x 32 tokens, 10 ms/step" if args.executor == "synthetic"
              else "embedded transformers engine (SmolLM2-135M, CPU)")
    print(f"one replica, {engine}; requests: {args.prompt_tokens} prompt + {args.max_tokens} output tokens; "
          f"{args.window:.0f} s per level")
    print(f"{'streams':>7} {'req/s':>6} {'TTFT p50':>9} {'TTFT p90':>9} {'kv used':>8} {'queued':>7} "
          f"{'kv demand':>9} {'batch demand':>12} {'NVIDIA q/c':>10}")
    errors = []
    for level in levels:
        errors += level.errors
        if not level.ttft:
            errors.append(f"{level.streams} streams: no request sent in the window finished (lengthen --window)")
            level.ttft = [float("nan")]
        print(f"{level.streams:>7} {level.finished / args.window:>6.1f} {statistics.median(level.ttft) * 1000:>7.1f}ms "
              f"{p90(level.ttft) * 1000:>7.1f}ms {statistics.mean(level.fraction):>8.2f} "
              f"{statistics.mean(level.queued):>7.1f} {statistics.mean(level.demand):>9.2f} "
              f"{statistics.mean(level.batch):>12.2f} {level.queue_compute:>10.3f}")
    demands = [statistics.mean(level.demand if args.signal == "kv" else level.batch) for level in levels]
    print(f"judged: {args.signal} demand")
    p50s = [statistics.median(level.ttft) for level in levels]
    p90s = [p90(level.ttft) for level in levels]
    # Degradation relative to the lightest level: the larger of the two ratios.
    ratios = [max(median / p50s[0], tail / p90s[0]) for median, tail in zip(p50s, p90s)]
    rising = all(b > a for a, b in zip(demands, demands[1:]))
    crossed = next((i for i, d in enumerate(demands) if d >= args.target), None)
    degraded = next((i for i, r in enumerate(ratios) if r > 2), None)
    print(f"signal rises at every level: {'yes' if rising else 'NO'}")
    if crossed is None:
        print(f"target {args.target}: never reached")
    else:
        print(f"target {args.target}: reached at {levels[crossed].streams} streams, TTFT p50/p90 "
              f"{p50s[crossed] / p50s[0]:.2f}x/{p90s[crossed] / p90s[0]:.2f}x the lightest level's")
    if degraded is not None:
        print(f"TTFT p50 or p90 first above 2x the lightest level's: {levels[degraded].streams} streams "
              f"({ratios[degraded]:.1f}x)")
    for error in errors[:5]:
        print(f"error: {error}")
    ok = rising and crossed is not None and ratios[crossed] <= 2 and not errors
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
