"""The server's CPU a delivered token in NVIDIA's LLM API layout, over the fake LLM API (tests/fakes/tensorrt_llm).

    .venv/bin/python bench/llmapi_cpu.py [--loads 1 16] [--step-ms 10] [--window 8] [--max-tokens 64]
    .venv/bin/python bench/llmapi_cpu.py --engine-alone        # the fake engine and the executor, no Triton

One server (`trtllm-triton serve`, the LLM API layout decoupled, executor trtllm_llmapi over the fake LLM, which
makes one token a request every `--step-ms`). At each load N, N gRPC streams send `--max-tokens`-token streaming
requests back to back; after `--warmup` seconds a `--window`-second window counts the tokens that reached the clients
(the growth of each request's cumulative `text_output`: the fake's tokens are one character each) and the CPU time of
the server's process tree (serve, tritonserver, the stub). Printed a load: delivered tok/s, responses/s, server cores
and microseconds of server CPU a delivered token, the stub's share apart. `--engine-alone` measures instead, in this
process with no Triton and no poller, the CPU a step of the fake LLM and the project's LLM API executor alone (its
event loop and hand-offs): the part of a stub's CPU that comes with the engine, whatever model sends the responses.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR.parent / "tests")]

from conftest import start_server  # noqa: E402
from triton_client import as_inputs  # noqa: E402
from trtllm_support import FAKES_DIR, make_checkpoint_dir  # noqa: E402

from trtllm_model.server import PROJECT_ROOT  # noqa: E402

PROMPT = "!"  # byte 33: the fake's next tokens are bytes 34, 35, ...: one ASCII character a token up to 93 tokens


def repository(workdir: Path, max_batch: int) -> Path:
    root = workdir / "repository"
    version = root / "tensorrt_llm" / "1"
    shutil.copytree(PROJECT_ROOT / "model_repository_llmapi" / "tensorrt_llm", root / "tensorrt_llm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    checkpoint = make_checkpoint_dir(workdir / "checkpoint")
    (version / "model.yaml").write_text(
        f"executor: trtllm_llmapi\nmodel: {checkpoint}\nbackend: pytorch\nmax_batch_size: {max_batch}\n"
        f"triton_config:\n  max_batch_size: 0\n  decoupled: true\n")
    shutil.copytree(FAKES_DIR / "tensorrt_llm", version / "tensorrt_llm", ignore=shutil.ignore_patterns("__pycache__"))
    return root


class Stream:
    """One gRPC stream sending streaming requests one after another; counts the tokens that arrive in the window."""

    def __init__(self, url: str, number: int, max_tokens: int) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.number, self.max_tokens = number, max_tokens
        self.counting = False
        self.tokens = self.responses = self.errors = 0
        self._sent = 0
        self._seen = 0
        self._stopped = False
        self.client.start_stream(callback=self._on_response)

    def _inputs(self):
        return as_inputs({"text_input": np.array([PROMPT], dtype=object),
                          "sampling_param_max_tokens": np.array([self.max_tokens], dtype=np.int32),
                          "streaming": np.array([True])})

    def send(self) -> None:
        self._sent += 1
        self._seen = 0
        self.client.async_stream_infer("tensorrt_llm", self._inputs(), request_id=f"s{self.number}-{self._sent}",
                                       enable_empty_final_response=True)

    def _on_response(self, result, error) -> None:
        if error is not None:
            self.errors += self.counting
            final = True
        else:
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            text = result.as_numpy("text_output")
            if text is not None:
                body = text.reshape(-1)[0].decode("utf-8", errors="replace")
                length = len(body) - (len(PROMPT) if body.startswith(PROMPT) else 0)
                if self.counting:
                    self.tokens += max(0, length - self._seen)
                    self.responses += 1
                self._seen = max(self._seen, length)
        if final and not self._stopped:
            self.send()

    def close(self) -> None:
        self._stopped = True
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


def server_cpu(root: psutil.Process) -> tuple[float, float]:
    """CPU seconds of the server's process tree, and of its Python backend stubs among them."""
    total = stubs = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            seconds = times.user + times.system
            total += seconds
            if "stub" in process.name():
                stubs += seconds
        except psutil.NoSuchProcess:
            pass
    return total, stubs


def engine_alone(load: int, step_ms: str, max_tokens: int, warmup: float, window: float) -> dict:
    """CPU a step of the fake LLM and LlmApiExecutor in this process: `load` requests kept running, steps drained."""
    import os
    import resource
    import threading

    os.environ["FAKE_TRTLLM_STEP_MS"] = step_ms
    sys.path.insert(0, str(FAKES_DIR))
    import tensorrt_llm

    from trtllm_model.executor_interface import GenerationRequest
    from trtllm_model.executors.trtllm_llmapi import LlmApiExecutor

    with tempfile.TemporaryDirectory(prefix="llmapi-alone-") as tmp:
        llm = tensorrt_llm.LLM(model=str(make_checkpoint_dir(Path(tmp) / "checkpoint")), max_batch_size=max(64, load))
        executor = LlmApiExecutor(llm, tensorrt_llm.SamplingParams)
        count, running = [0], [True]

        def request() -> GenerationRequest:
            return GenerationRequest(input_ids=[ord(PROMPT)], max_tokens=max_tokens, streaming=True)

        def drain() -> None:
            while running[0]:
                for step in executor.await_steps(0.1):
                    count[0] += len(step.token_ids)
                    if step.is_final and running[0]:
                        executor.enqueue(request())

        for _ in range(load):
            executor.enqueue(request())
        thread = threading.Thread(target=drain, daemon=True)
        thread.start()
        time.sleep(warmup)
        usage0, tokens0, t0 = resource.getrusage(resource.RUSAGE_SELF), count[0], time.monotonic()
        time.sleep(window)
        usage1, tokens1, t1 = resource.getrusage(resource.RUSAGE_SELF), count[0], time.monotonic()
        running[0] = False
        thread.join(1.0)
        executor.shutdown()
    cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    tokens = tokens1 - tokens0
    return {"streams": load, "tok_s": tokens / (t1 - t0), "cores": cpu / (t1 - t0),
            "us_per_token": 1e6 * cpu / tokens if tokens else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--step-ms", default="10")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--engine-alone", action="store_true", help="the fake LLM and the executor in process only")
    args = parser.parse_args()
    if args.max_tokens > 90:
        parser.error("--max-tokens: at most 90 (the fake's tokens stay one ASCII character each)")
    rows = []
    if args.engine_alone:
        for load in args.loads:
            row = engine_alone(load, args.step_ms, args.max_tokens, args.warmup, args.window)
            rows.append(row)
            print(f"{load:4d} streams, engine alone: {row['tok_s']:7.0f} tok/s, {row['cores']:.3f} cores, "
                  f"{row['us_per_token'] or 0:.0f} us a token", flush=True)
    else:
        rows = measure_server(args)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


def measure_server(args: argparse.Namespace) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmapi-cpu-") as tmp:
        workdir = Path(tmp)
        repo = repository(workdir, max(64, max(args.loads)))
        env = {"FAKE_TRTLLM_STEP_MS": args.step_ms}
        server = start_server(workdir / "server", executor=None, repository=repo, env=env, models=("tensorrt_llm",))
        try:
            root = psutil.Process(server.process.pid)
            for load in args.loads:
                streams = [Stream(server.grpc_url, n, args.max_tokens) for n in range(load)]
                for stream in streams:
                    stream.send()
                time.sleep(args.warmup)
                (cpu0, stub0), t0 = server_cpu(root), time.monotonic()
                for stream in streams:
                    stream.counting = True
                time.sleep(args.window)
                for stream in streams:
                    stream.counting = False
                (cpu1, stub1), t1 = server_cpu(root), time.monotonic()
                for stream in streams:
                    stream.close()
                tokens = sum(s.tokens for s in streams)
                row = {"streams": load, "tok_s": tokens / (t1 - t0),
                       "responses_s": sum(s.responses for s in streams) / (t1 - t0),
                       "server_cores": (cpu1 - cpu0) / (t1 - t0),
                       "stub_cores": (stub1 - stub0) / (t1 - t0),
                       "us_per_token": 1e6 * (cpu1 - cpu0) / tokens if tokens else None,
                       "stub_us_per_token": 1e6 * (stub1 - stub0) / tokens if tokens else None,
                       "errors": sum(s.errors for s in streams)}
                rows.append(row)
                print(f"{load:4d} streams: {row['tok_s']:7.0f} tok/s, {row['responses_s']:7.0f} responses/s, server "
                      f"{row['server_cores']:.2f} cores, {row['us_per_token'] or 0:.0f} us a token (stub "
                      f"{row['stub_us_per_token'] or 0:.0f}), "
                      f"errors {row['errors']}", flush=True)
                time.sleep(1.0)
        finally:
            server.stop()
    return rows


if __name__ == "__main__":
    sys.exit(main())
