"""What NVIDIA's three-model path costs next to `ensemble`'s in-process fast path, measured in one run.

    .venv/bin/python bench/nvidia_repository.py                          # synthetic executor, about 2 minutes
    .venv/bin/python bench/nvidia_repository.py --executor transformers --max-tokens 16 --concurrency 1 2

One server (`trtllm-triton serve --decoupled false`, NVIDIA's five models) and the same prompt and max tokens on
three paths, as NVIDIA's end_to_end_test.py calls them (gRPC: its `-i grpc`; one client per thread):
  - ensemble: one call (tokenize, generate, detokenize inside `tensorrt_llm`);
  - tensorrt_llm_bls: one call, forwarded to `tensorrt_llm` (one extra hop inside the server);
  - three models: preprocessing -> tensorrt_llm (token ids) -> postprocessing, three client calls.
At each concurrency C, C client threads send requests back to back for `--seconds`; each path gets its own window
after a short warm-up. Printed: p50 latency per request and generated tokens/s, and both as ratios against
ensemble. The synthetic executor (`--step-ms` per step, the default) takes the model's cost out, so what is left is
the path's own; the embedded SmolLM2 (`--executor transformers`) shows the cost next to a real model's.

`--metrics-gap N` measures instead what NVIDIA's metric checks meet: N requests one at a time (tensorrt_llm with
token ids, then ensemble), each followed at once by a scrape of /metrics; printed: how often that scrape missed the
request in nv_llm_output_token_len_count, and how long after the response the count appeared (p50, max).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import requests
import tritonclient.grpc as grpcclient

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
from conftest import start_server  # noqa: E402
from prometheus_text import parse  # noqa: E402
from triton_client import as_inputs  # noqa: E402

MODELS = ("tensorrt_llm", "ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls")
PROMPT = "Write a short story about a lighthouse keeper. Once upon a time,"


def text_call(model: str, max_tokens: int) -> Callable[[grpcclient.InferenceServerClient], int]:
    """ensemble / tensorrt_llm_bls as end_to_end_test.py calls them; returns the tokens generated."""
    inputs = {"text_input": np.array([[PROMPT]], dtype=object), "max_tokens": np.array([[max_tokens]], dtype=np.int32),
              "bad_words": np.array([[""]], dtype=object), "stop_words": np.array([[""]], dtype=object),
              "return_num_output_tokens": np.array([[True]])}
    wanted = [grpcclient.InferRequestedOutput("text_output"), grpcclient.InferRequestedOutput("num_output_tokens")]

    def call(client: grpcclient.InferenceServerClient) -> int:
        result = client.infer(model, as_inputs(inputs), outputs=wanted)
        return int(result.as_numpy("num_output_tokens").sum())

    return call


def three_model_call(max_tokens: int) -> Callable[[grpcclient.InferenceServerClient], int]:
    """preprocessing -> tensorrt_llm -> postprocessing, as end_to_end_test.py chains them."""
    query = {"QUERY": np.array([[PROMPT]], dtype=object), "BAD_WORDS_DICT": np.array([[""]], dtype=object),
             "STOP_WORDS_DICT": np.array([[""]], dtype=object),
             "REQUEST_OUTPUT_LEN": np.array([[max_tokens]], dtype=np.int32)}

    def call(client: grpcclient.InferenceServerClient) -> int:
        pre = client.infer("preprocessing", as_inputs(query))
        llm = client.infer("tensorrt_llm", as_inputs({
            "input_ids": pre.as_numpy("INPUT_ID"), "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),
            "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"), "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
            "end_id": pre.as_numpy("OUT_END_ID"), "pad_id": pre.as_numpy("OUT_PAD_ID"),
        }))
        lengths = llm.as_numpy("sequence_length")
        post = client.infer("postprocessing", as_inputs({
            "TOKENS_BATCH": llm.as_numpy("output_ids").astype(np.int32), "SEQUENCE_LENGTH": lengths}))
        assert post.as_numpy("OUTPUT").size == 1
        return int(lengths.sum())

    return call


def measure(url: str, call: Callable, concurrency: int, seconds: float, warmup_s: float) -> dict[str, float]:
    """C threads, each with its own client, calling back to back; latencies and tokens inside the window only."""
    start = time.monotonic() + warmup_s
    stop = start + seconds
    latencies: list[float] = []
    tokens = [0]
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        client = grpcclient.InferenceServerClient(url)
        while time.monotonic() < stop:
            began = time.monotonic()
            try:
                generated = call(client)
            except Exception as exc:  # counted and shown: a path that fails has no cost to report
                with lock:
                    errors.append(str(exc))
                continue
            ended = time.monotonic()
            if began >= start and ended <= stop:
                with lock:
                    latencies.append(ended - began)
                    tokens[0] += generated
        client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return {"p50_ms": 1000 * statistics.median(latencies), "tokens_per_s": tokens[0] / seconds,
            "requests": len(latencies)}


def output_count(session: requests.Session, metrics_url: str) -> float:
    scrape = parse(session.get(metrics_url, timeout=10).text)
    return scrape.value("nv_llm_output_token_len_count", model="tensorrt_llm", version="1",
                        response_metric_type="total_output_tokens")


def metrics_gap(url: str, metrics_url: str, requests_n: int, max_tokens: int) -> dict[str, dict[str, float]]:
    """Per path: the share of scrapes right after a response that missed it, and the lag until it appeared."""
    client = grpcclient.InferenceServerClient(url)
    token_inputs = {"input_ids": np.array([[72, 101, 108, 108, 111]], dtype=np.int32),
                    "input_lengths": np.array([[5]], dtype=np.int32),
                    "request_output_len": np.array([[max_tokens]], dtype=np.int32)}
    calls = {"tensorrt_llm": lambda: client.infer("tensorrt_llm", as_inputs(token_inputs)),
             "ensemble": lambda: text_call("ensemble", max_tokens)(client)}
    out = {}
    with requests.Session() as session:
        for name, call in calls.items():
            misses, lags = 0, []
            for _ in range(requests_n):
                before = output_count(session, metrics_url)
                call()
                received = time.monotonic()
                if output_count(session, metrics_url) <= before:
                    misses += 1
                while output_count(session, metrics_url) <= before:
                    if time.monotonic() - received > 5:
                        raise RuntimeError(f"{name}: the request never reached the histogram")
                lags.append(time.monotonic() - received)
            out[name] = {"missed": misses / requests_n, "lag_p50_ms": 1000 * statistics.median(lags),
                         "lag_max_ms": 1000 * max(lags)}
    client.close()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", default="synthetic", choices=("synthetic", "transformers"))
    parser.add_argument("--step-ms", type=float, default=10.0, help="synthetic executor: time per step")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per path and concurrency")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--metrics-gap", type=int, default=0, metavar="N",
                        help="measure instead how often a scrape right after a response misses it (N requests)")
    args = parser.parse_args(argv)

    parameters = {"max_queue_size": "1024", "max_batch_size": str(max(64, max(args.concurrency)))}
    if args.executor == "synthetic":
        parameters["synthetic_step_ms"] = str(args.step_ms)
    paths = {"ensemble": text_call("ensemble", args.max_tokens),
             "tensorrt_llm_bls": text_call("tensorrt_llm_bls", args.max_tokens),
             "three models": three_model_call(args.max_tokens)}
    with tempfile.TemporaryDirectory(prefix="nvidia-repository-bench-") as workdir:
        server = start_server(Path(workdir), executor=args.executor, models=MODELS, parameters=parameters,
                              serve_args=["--decoupled", "false"])
        try:
            url = server.grpc_url
            if args.metrics_gap:
                for name, gap in metrics_gap(url, server.metrics_url, args.metrics_gap, args.max_tokens).items():
                    print(f"{name}: a scrape right after the response missed it {100 * gap['missed']:.0f}% of "
                          f"{args.metrics_gap}; in /metrics {gap['lag_p50_ms']:.2f} ms after the response (p50), "
                          f"{gap['lag_max_ms']:.2f} ms (max)")
                return 0
            rows = []
            for concurrency in args.concurrency:
                results = {name: measure(url, call, concurrency, args.seconds, args.warmup)
                           for name, call in paths.items()}
                base = results["ensemble"]
                for name, result in results.items():
                    rows.append((concurrency, name, result, result["p50_ms"] / base["p50_ms"],
                                 result["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else float("nan")))
        finally:
            server.stop()
    pace = f"synthetic, {args.step_ms:g} ms/step" if args.executor == "synthetic" else "embedded SmolLM2"
    print(f"executor {pace}; {args.max_tokens} tokens per request; {args.seconds:g} s per window; gRPC, unary")
    print(f"{'conc':>4}  {'path':<17} {'p50 ms':>8} {'tok/s':>8} {'reqs':>5}  {'p50 x ens':>9} {'tok/s x ens':>11}")
    for concurrency, name, result, latency_ratio, rate_ratio in rows:
        print(f"{concurrency:>4}  {name:<17} {result['p50_ms']:>8.1f} {result['tokens_per_s']:>8.1f} "
              f"{result['requests']:>5}  {latency_ratio:>9.3f} {rate_ratio:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
