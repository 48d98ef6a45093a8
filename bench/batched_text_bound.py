"""A small request beside one 64-row `tensorrt_llm` request of long text prompts (the embedded SmolLM2 on CPU).

    .venv/bin/python bench/batched_text_bound.py [--rows 64] [--row-bytes 600000] [--delay 1.0]

Starts `trtllm-triton serve --executor transformers` (tensorrt_llm alone). Prints a 4-token request's time to first
token alone (median of 3), then beside the batched request (sent `--delay` seconds after it, on another connection:
its 38 MB have reached the model by then), and how long the batched request took to be answered (refused, or its rows' errors). Each row is under the one-prompt byte bound
(663,552 bytes for SmolLM2 at max_input_len 4096); docs/security.md cites this.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import start_server  # noqa: E402
from triton_client import StreamClient, tensor, token_inputs  # noqa: E402


def first_token_s(client: StreamClient, request_id: str) -> float:
    sent = time.monotonic()
    result = client.send("tensorrt_llm", token_inputs([1, 504, 3575], 4), request_id)
    while not result.responses:
        assert not result.errors and not result.done.wait(0.002), result.errors
    return time.monotonic() - sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--row-bytes", type=int, default=600_000)
    parser.add_argument("--delay", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batched-text-") as workdir:
        server = start_server(Path(workdir), executor="transformers", models=("tensorrt_llm",))
        small, big = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
        try:
            alone = statistics.median(first_token_s(small, f"alone-{i}") for i in range(3))
            prompts = np.array([[b"hello world " * (args.row_bytes // 12)] for _ in range(args.rows)], np.object_)
            inputs = [tensor("text_input", prompts, np.object_), tensor("max_tokens", np.full((args.rows, 1), 8), np.int32),
                      tensor("stream", np.full((args.rows, 1), True), np.bool_)]
            sent = time.monotonic()
            batch = big.send("tensorrt_llm", inputs, "batch")
            time.sleep(args.delay)
            beside = first_token_s(small, "beside")
            batch.wait(600)
            answered = time.monotonic() - sent
        finally:
            small.close()
            big.close()
            server.stop()
    print(f"{args.rows} rows of {args.row_bytes} bytes: answered in {answered:.2f} s ({batch.errors[0][:90] if batch.errors else 'no error'}); "
          f"a small request's first token {beside:.2f} s beside it, {alone:.2f} s alone ({beside / alone:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
