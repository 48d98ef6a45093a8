"""Stream a chat answer over gRPC from the `ensemble` model, printing text as it arrives.

    .venv/bin/python client_examples/chat_grpc_stream.py "What is the capital of France?"
    .venv/bin/python client_examples/chat_grpc_stream.py --no-chat-template --max-tokens 20 "Once upon a time"

The prompt goes in `text_input`; `apply_chat_template` (on by default here) asks the server to wrap it in the
model's chat template. Each streamed response carries the new text in `text_output`; the last one is marked by
the `triton_final_response` parameter.
"""

from __future__ import annotations

import argparse
import queue
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def scalar(name: str, value, datatype: str, dtype) -> grpcclient.InferInput:
    array = np.array([[value]], dtype=dtype)
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def build_inputs(args: argparse.Namespace) -> list[grpcclient.InferInput]:
    inputs = [
        scalar("text_input", args.prompt.encode("utf-8"), "BYTES", np.object_),
        scalar("max_tokens", args.max_tokens, "INT32", np.int32),
        scalar("stream", True, "BOOL", bool),
        scalar("apply_chat_template", args.chat_template, "BOOL", bool),
        scalar("return_finish_reason", True, "BOOL", bool),
    ]
    if args.temperature is not None:
        inputs.append(scalar("temperature", args.temperature, "FP32", np.float32))
    if args.top_p is not None:
        inputs.append(scalar("top_p", args.top_p, "FP32", np.float32))
    if args.seed is not None:
        inputs.append(scalar("seed", args.seed, "UINT64", np.uint64))
    return inputs


def is_final(result) -> bool:
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt")
    parser.add_argument("--url", default="localhost:8001", help="gRPC address of tritonserver (default localhost:8001)")
    parser.add_argument("--model", default="ensemble")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wrap the prompt in the model's chat template on the server (default: on)",
    )
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the whole answer")
    args = parser.parse_args()

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    started = time.monotonic()
    first_text_at = None
    chunks = 0
    finish_reason = None
    try:
        client.async_stream_infer(args.model, build_inputs(args), enable_empty_final_response=True)
        while True:
            try:
                result, error = responses.get(timeout=max(0.0, started + args.timeout - time.monotonic()))
            except queue.Empty:
                print(f"\n[no final response within {args.timeout:.0f} s]", file=sys.stderr)
                return 1
            if error is not None:
                print(f"\n[server error] {error}", file=sys.stderr)
                return 1
            text = result.as_numpy("text_output")
            if text is not None and text.size:
                piece = text.reshape(-1)[0].decode("utf-8")
                if piece:
                    first_text_at = first_text_at or time.monotonic()
                    chunks += 1
                    print(piece, end="", flush=True)
            reason = result.as_numpy("finish_reason")
            if reason is not None and reason.size:
                finish_reason = reason.reshape(-1)[0].decode()
            if is_final(result):
                break
    except InferenceServerException as exc:
        print(f"\n[error] {exc}", file=sys.stderr)
        return 1
    finally:
        client.stop_stream()
        client.close()
    elapsed = time.monotonic() - started
    ttft = f"{first_text_at - started:.2f} s" if first_text_at else "-"
    print(
        f"\n[{chunks} chunks in {elapsed:.2f} s, first text after {ttft}, finish reason: {finish_reason}]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
