"""N concurrent gRPC streams against the `ensemble` model; reports generated tokens per second and latencies.

    .venv/bin/python client_examples/concurrent_load.py --streams 8 --requests 2 --max-tokens 64

Each stream is its own gRPC client and stream (tritonclient allows one stream per client) running requests one
after another. Tokens are counted from `num_output_tokens` (the server's running count for the request).

Several replicas: `--url host1:8001,host2:8001` spreads the streams over them, stream i to address i mod n
(client-side balancing: a gRPC stream is one long-lived HTTP/2 call, so a connection-level balancer such as a
Kubernetes ClusterIP Service would send all of one client's streams to one replica). On Kubernetes, list the pods
behind the headless Service (docs/kubernetes.md):

    .venv/bin/python client_examples/concurrent_load.py \
        --url "$(getent ahostsv4 trtllm-triton-cpu-grpc | awk '{print $1":8001"}' | sort -u | paste -sd,)"
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in simple terms.",
    "Give me three tips for a good night's sleep.",
    "What is 17 times 23?",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
    "Suggest a name for a small bakery.",
]


@dataclass
class StreamStats:
    tokens: int = 0
    requests: int = 0
    responses: int = 0
    ttfts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def scalar(name: str, value, datatype: str, dtype) -> grpcclient.InferInput:
    array = np.array([[value]], dtype=dtype)
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def run_stream(index: int, args: argparse.Namespace, stats: StreamStats) -> None:
    responses: queue.Queue = queue.Queue()
    urls = args.url.split(",")
    client = grpcclient.InferenceServerClient(urls[index % len(urls)])
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        for number in range(args.requests):
            prompt = PROMPTS[(index + number) % len(PROMPTS)]
            inputs = [
                scalar("text_input", prompt.encode(), "BYTES", np.object_),
                scalar("max_tokens", args.max_tokens, "INT32", np.int32),
                scalar("stream", True, "BOOL", bool),
                scalar("apply_chat_template", args.chat_template, "BOOL", bool),
                scalar("return_num_output_tokens", True, "BOOL", bool),
            ]
            if args.ignore_eos:
                inputs.append(scalar("min_tokens", args.max_tokens, "INT32", np.int32))
            started, first, tokens = time.monotonic(), None, 0
            client.async_stream_infer(args.model, inputs, enable_empty_final_response=True)
            while True:
                result, error = responses.get(timeout=args.timeout)
                if error is not None:
                    stats.errors.append(str(error))
                    break
                count = result.as_numpy("num_output_tokens")
                if count is not None and count.size:
                    tokens = max(tokens, int(count.reshape(-1)[0]))
                    if tokens and first is None:
                        first = time.monotonic() - started
                    stats.responses += 1
                parameters = result.get_response().parameters
                if "triton_final_response" in parameters and parameters["triton_final_response"].bool_param:
                    break
            stats.tokens += tokens
            stats.requests += 1
            stats.latencies.append(time.monotonic() - started)
            if first is not None:
                stats.ttfts.append(first)
    except queue.Empty:
        stats.errors.append(f"no response within {args.timeout} s")
    finally:
        client.stop_stream()
        client.close()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="localhost:8001", help="gRPC address; several, comma-separated: one per replica")
    parser.add_argument("--model", default="ensemble")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams (default 8)")
    parser.add_argument("--requests", type=int, default=2, help="requests per stream, one after another (default 2)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--ignore-eos", action="store_true", help="min_tokens = max_tokens: every answer is full length"
    )
    parser.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for any one response")
    args = parser.parse_args()

    stats = [StreamStats() for _ in range(args.streams)]
    threads = [threading.Thread(target=run_stream, args=(i, args, stats[i])) for i in range(args.streams)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started

    tokens = sum(s.tokens for s in stats)
    ttfts = [t for s in stats for t in s.ttfts]
    latencies = [t for s in stats for t in s.latencies]
    errors = [e for s in stats for e in s.errors]
    print(
        f"streams {args.streams}, requests {sum(s.requests for s in stats)}, tokens {tokens}, "
        f"responses {sum(s.responses for s in stats)}, wall {elapsed:.1f} s"
    )
    print(f"throughput {tokens / elapsed:.1f} tokens/s")
    if ttfts:
        print(f"time to first token: p50 {statistics.median(ttfts):.2f} s, p95 {percentile(ttfts, 0.95):.2f} s")
    if latencies:
        print(f"request latency: p50 {statistics.median(latencies):.2f} s, p95 {percentile(latencies, 0.95):.2f} s")
    for error in errors[:5]:
        print(f"error: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
