"""Stress a text-level model: N closed-loop gRPC streams of short requests against the synthetic executor. On
`tensorrt_llm_bls` (a BLS relay, as `ensemble` was until 2026-12-03) it reproduces the stall of docs/history/2026-12-02-03-serving-layer-and-first-gpu-host.md
("Server fault seen under this load": a deadlock inside Triton 2.51's Python stub, all streams stop with both stubs
alive); `ensemble`, now a Triton ensemble, has no stub to stall.

    .venv/bin/python bench/text_model_stress.py /tmp/stress-1 --model tensorrt_llm_bls --streams 32 --seconds 15

Prints `done <requests> errors <count> ... ready <status>` when every stream ended; a run that prints nothing past
its --seconds (plus a few) has stalled: take the stacks then, e.g. `gdb -p <pid> -batch -ex "thread apply all bt"`
for each `triton_python_backend_stub` under the work directory and for tritonserver (about 1 run in 3 stalled on
2 cores, 2026-12-03). `--check-s` overrides the BLS relay's cancellation-watch period (shorter crowds the stub's
queue).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from conftest import start_server, write_repository  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

LOG_SIGNS = ("not healthy", "Signal (11)", "Signal (6)", "malloc", "lock_exception", "Segmentation", "Traceback", "Fatal")


def stream_request(model: str, request_id: str, tokens: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    text = b"hello there"
    for name, datatype, raw in (("text_input", "BYTES", len(text).to_bytes(4, "little") + text),
                                ("max_tokens", "INT32", tokens.to_bytes(4, "little")), ("stream", "BOOL", b"\x01")):
        tensor = request.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend([1, 1])
        request.raw_input_contents.append(raw)
    return request


async def one_stream(stub, model: str, index: int, end: float, tokens: int, stats: dict) -> None:
    """Requests one after another on one gRPC stream until `end`, each read to its final response."""
    call = stub.ModelStreamInfer()
    sent = 0
    try:
        while time.monotonic() < end:
            await call.write(stream_request(model, f"s{index}-{sent}", tokens))
            sent += 1
            while True:
                message = await asyncio.wait_for(call.read(), 30)
                if message is grpc.aio.EOF:
                    raise ConnectionError("stream closed")
                if message.error_message:
                    raise RuntimeError(message.error_message)
                final = message.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
            stats["done"] += 1
    except Exception as exc:  # noqa: BLE001 - counted and printed
        stats["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        call.cancel()


async def run_streams(url: str, model: str, streams: int, seconds: float, tokens: int) -> dict:
    stats = {"done": 0, "errors": []}
    channels = [grpc.aio.insecure_channel(url, options=[("grpc.channel_id", k)]) for k in range(4)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
    end = time.monotonic() + seconds
    await asyncio.gather(*[one_stream(stubs[i % 4], model, i, end, tokens, stats) for i in range(streams)])
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--model", choices=("ensemble", "tensorrt_llm_bls"), default="tensorrt_llm_bls")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--step-ms", default="2", help="the synthetic executor's step time")
    parser.add_argument("--check-s", type=float, default=None, help="bls_forwarding.CANCEL_CHECK_S for this run")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    repository = write_repository(args.workdir / "repository",
                                  {"synthetic_step_ms": args.step_ms, "max_batch_size": "256"},
                                  models=("tensorrt_llm", args.model))
    if args.check_s is not None and args.model == "tensorrt_llm_bls":
        (repository / args.model / "1" / "model.py").write_text(
            f"import trtllm_model.triton.bls_forwarding as m\nm.CANCEL_CHECK_S = {args.check_s}\n"
            "from trtllm_model.triton.bls_model import TritonPythonModel  # noqa: E402,F401\n")
    server = start_server(args.workdir, executor="synthetic", repository=repository,
                          env={"PYTHONFAULTHANDLER": "1"})
    try:
        stats = asyncio.run(run_streams(server.grpc_url, args.model, args.streams, args.seconds, args.tokens))
        try:
            ready = urllib.request.urlopen(f"{server.http_url}/v2/models/{args.model}/ready", timeout=5).status
        except Exception as exc:  # noqa: BLE001 - printed
            ready = repr(exc)
        print("done", stats["done"], "errors", len(stats["errors"]), stats["errors"][:3], "ready", ready, flush=True)
    finally:
        server.stop()
    log = (args.workdir / "server.log").read_text(errors="replace")
    for sign in LOG_SIGNS:
        if sign in log:
            print("server log has", repr(sign))


if __name__ == "__main__":
    main()
