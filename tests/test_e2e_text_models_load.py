"""The text-level models under load: many closed-loop gRPC streams of short requests for a fixed time against the
synthetic executor. Every request ends with exactly one final response, no stream stalls, and every stub survives.

`ensemble` was a Python BLS relay until 2026-12-03; under this load Triton 2.51's stub first crashed (fixed by
IteratorKeeper, trtllm_model/triton/bls_forwarding.py), then deadlocked in its BLS iterators now and then (all streams
stalled, both stubs alive: docs/reliability.md). As a Triton ensemble it has no stub of its own.

`tensorrt_llm_bls` still relays through BLS: before IteratorKeeper this load killed its stub within seconds in most
runs (Triton 2.51's stub freed finished BLS response iterators on its own C++ thread, without the GIL). Many short
requests and a busy stub-to-parent queue (cancellation checks every few milliseconds) make that race frequent enough
to see here.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import grpc
import pytest
from conftest import start_server, write_repository
from tritonclient.grpc import service_pb2, service_pb2_grpc

pytestmark = pytest.mark.e2e

STREAMS = 48
SECONDS = 20.0
TOKENS = 2
READ_TIMEOUT_S = 10.0  # a stream with no response this long has stalled
CANCEL_CHECK_S = 0.005  # tensorrt_llm_bls's watch asks Triton about every open stream this often (default 0.1 s)


def _request(model: str, request_id: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    text = b"how are you"
    for name, datatype, raw in (
        ("text_input", "BYTES", len(text).to_bytes(4, "little") + text),
        ("max_tokens", "INT32", TOKENS.to_bytes(4, "little")),
        ("stream", "BOOL", b"\x01"),
    ):
        tensor = request.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend([1, 1])
        request.raw_input_contents.append(raw)
    return request


async def _stream(stub, model: str, index: int, end: float, finals: dict[str, int], problems: list[str]) -> None:
    """Requests one after another on one gRPC stream until `end`; counts each request's final responses."""
    call = stub.ModelStreamInfer()
    number = 0
    try:
        while time.monotonic() < end:
            request_id = f"s{index}-{number}"
            number += 1
            finals[request_id] = 0
            await call.write(_request(model, request_id))
            while finals[request_id] == 0:
                message = await asyncio.wait_for(call.read(), READ_TIMEOUT_S)
                if message is grpc.aio.EOF:
                    raise ConnectionError("the server ended the stream")
                if message.error_message:
                    raise RuntimeError(message.error_message)
                response = message.infer_response
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    finals[response.id] = finals.get(response.id, 0) + 1
    except Exception as exc:  # noqa: BLE001 - every stream's failure is reported
        problems.append(f"stream {index}, request {number - 1}: {type(exc).__name__}: {exc}")
    finally:
        call.cancel()


async def _load(url: str, model: str) -> tuple[dict[str, int], list[str]]:
    channels = [grpc.aio.insecure_channel(url, options=[("grpc.channel_id", i)]) for i in range(4)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
    finals: dict[str, int] = {}
    problems: list[str] = []
    end = time.monotonic() + SECONDS
    await asyncio.gather(*(_stream(stubs[i % 4], model, i, end, finals, problems) for i in range(STREAMS)))
    for channel in channels:
        await channel.close()
    return finals, problems


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_48_streams_of_short_requests_for_20_s_each_end_with_one_final_and_every_stub_stays_up(tmp_path, model):
    repository = write_repository(tmp_path / "repository", {"synthetic_step_ms": "2", "max_batch_size": "256"},
                                  models=("tensorrt_llm", model))
    if model == "tensorrt_llm_bls":
        (repository / model / "1" / "model.py").write_text(
            "import trtllm_model.triton.bls_forwarding as bls_forwarding\n"
            f"bls_forwarding.CANCEL_CHECK_S = {CANCEL_CHECK_S}\n"
            "from trtllm_model.triton.bls_model import TritonPythonModel  # noqa: E402,F401\n"
        )
    server = start_server(tmp_path, repository=repository)
    try:
        finals, problems = asyncio.run(_load(server.grpc_url, model))
        with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/ready", timeout=5) as answer:
            ready = answer.status
        alive = server.process.poll() is None
    finally:
        server.stop()
    log = server.log()
    assert "not healthy" not in log and "lock_exception" not in log, log[-3000:]
    assert problems == [], f"{len(problems)} of {STREAMS} streams failed, first: {problems[:3]}"
    assert alive and ready == 200
    assert len(finals) > STREAMS * 10, f"only {len(finals)} requests in {SECONDS} s"
    assert {count for count in finals.values()} == {1}, "a request without exactly one final response"
