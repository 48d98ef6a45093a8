"""Stopping the server after clients cancelled streams with `stop`, over the fake LLM API (executor trtllm_llmapi).

    .venv/bin/python bench/llmapi_stop_shutdown.py [--runs 10] [--streams 8] [--open 0]

Each run starts `trtllm-triton serve` with executor=trtllm_llmapi over tests/fakes/tensorrt_llm, opens `--streams`
long streams, stops each with NVIDIA's `stop` input (same request id), leaves `--open` streams running, then sends
SIGTERM to `serve` and times its exit. Issue 31 item 13: 3 runs of 10 could not unload `tensorrt_llm` within
tritonserver's 15 s exit timeout ("Exit timeout expired"). The clients keep their gRPC streams open unless
`--close-streams`; an open stream that carried a request keeps tritonserver 2.51 from unloading the model and from
exiting, so `serve` kills it EXIT_TIMEOUT_S + EXIT_KILL_MARGIN_S after the signal (exit code 1). Prints one line per
run and a summary.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import numpy as np  # noqa: E402
from conftest import start_server  # noqa: E402
from test_e2e_trtllm_fakes import FAKE_ENVIRONMENT, repository_with_fake  # noqa: E402
from triton_client import StreamClient, tensor, token_inputs  # noqa: E402
from trtllm_support import make_checkpoint_dir  # noqa: E402


def one_run(workdir: Path, streams: int, still_open: int, verbose: bool = False,
            close_streams: bool = False) -> tuple[float, bool, str]:
    """Seconds from SIGTERM to serve's exit, whether tritonserver's exit timeout expired, and serve's exit code."""
    checkpoint = make_checkpoint_dir(workdir / "checkpoint")
    repository = repository_with_fake(workdir, {"executor": "trtllm_llmapi", "hf_model_path": str(checkpoint)},
                                      ("tensorrt_llm",))
    server = start_server(workdir, executor="trtllm_llmapi", env=FAKE_ENVIRONMENT, repository=repository,
                          serve_args=["--log-verbose=1"] if verbose else None)
    client, stopper = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        running = [client.send("tensorrt_llm", token_inputs([1000 + i], 4000), f"r{i}")
                   for i in range(streams + still_open)]
        deadline = time.monotonic() + 30
        while not all(r.responses for r in running) and time.monotonic() < deadline:
            time.sleep(0.01)
        stops = [stopper.send("tensorrt_llm", [*token_inputs([1], 1), tensor("stop", True, np.bool_)], f"r{i}")
                 for i in range(streams)]
        for result in stops + running[:streams]:
            result.wait(30)
        if close_streams:  # a client done with its requests: tritonserver 2.51 stops only once every stream closed
            client.close()
            stopper.close()
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            code = str(server.process.wait(60))
        except Exception:  # noqa: BLE001 - still there after 60 s: report it and kill it
            code = "hung"
            server.process.kill()
            server.process.wait()
        return time.monotonic() - started, "Exit timeout expired" in server.log(), code
    finally:
        client.close()
        stopper.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--streams", type=int, default=8, help="streams stopped with `stop` before the SIGTERM")
    parser.add_argument("--open", type=int, default=0, help="streams still running at the SIGTERM")
    parser.add_argument("--close-streams", action="store_true", help="clients close their gRPC streams before SIGTERM")
    args = parser.parse_args()
    slow = 0
    with tempfile.TemporaryDirectory(prefix="llmapi-stop-") as root:
        for run in range(args.runs):
            seconds, expired, code = one_run(Path(root) / f"run{run}", args.streams, args.open,
                                             close_streams=args.close_streams)
            slow += expired or seconds > 10
            print(f"run {run}: exit {code} after {seconds:.1f} s{'  EXIT TIMEOUT EXPIRED' if expired else ''}",
                  flush=True)
    print(f"{slow} of {args.runs} runs took over 10 s or hit tritonserver's exit timeout")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
