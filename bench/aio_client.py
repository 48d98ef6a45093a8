"""The benchmark's load client: asyncio gRPC streams on Triton's own service (grpc.aio), in worker processes.

One *load stream* is one bidirectional `ModelStreamInfer` call carrying one long request (it outlives the
measurement window, so the executor keeps every load request active and generates at a known pace). One *probe
stream* sends short requests one after another, so time to first token is measured while the load runs.

Every response's tokens are checked against the synthetic executor's formula (token i of a request whose last
input id is b is (b + 1 + i) % vocab_size); a wrong or missing token is counted as an error.

A worker measures, for responses that arrive inside the window [w0, w1) (time.monotonic, shared by processes):
tokens, responses, gaps between consecutive responses of one request, and its own CPU time.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from array import array
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

VOCAB_SIZE = 32000


@dataclass
class Plan:
    url: str
    model: str
    load_streams: int
    load_tokens: int  # max tokens of each load request (longer than the run)
    probe: bool  # this worker also runs the probe stream
    probe_tokens: int
    probe_pause_s: float
    start: float  # monotonic time to send the first requests
    w0: float
    w1: float
    channels: int = 4
    first_input_id: int = 0
    step_s: float = 0.01  # the synthetic executor's step: token i of a request exists ~(i + 1) steps after it
    # Text requests (`ensemble`'s names: text_input in, text_output back, as NVIDIA's text clients send them); tokens
    # are counted by the num_output_tokens output (the synthetic text is not one character a token).
    text: bool = False


@dataclass
class WorkerResult:
    tokens: int = 0
    responses: int = 0
    gaps: array = field(default_factory=lambda: array("d"))  # seconds between responses of one load request
    # Seconds from when the engine's pace says the newest token of a response existed to its arrival (load streams).
    lags: array = field(default_factory=lambda: array("d"))
    ttft: array = field(default_factory=lambda: array("d"))  # probe requests sent inside the window
    burst_ttft: array = field(default_factory=lambda: array("d"))  # load requests (all sent at `start`)
    probe_requests: int = 0
    ttft_censored: int = 0  # probe requests still without a first token when the run ended (their wait so far)
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    tokens_total: int = 0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _request(model: str, request_id: str, last_input_id: int, max_tokens: int,
             text: bool = False) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    tensors = (
        ("input_ids", "INT32", [1, 2], (7).to_bytes(4, "little") + last_input_id.to_bytes(4, "little")),
        ("request_output_len", "INT32", [1, 1], max_tokens.to_bytes(4, "little")),
        ("streaming", "BOOL", [1, 1], b"\x01"),
    )
    if text:
        # One ASCII byte of prompt (the synthetic tokenizer is byte-level); its own id as end_id is reached only
        # after a whole cycle of the vocabulary, so a load request outlives the run.
        byte = 33 + last_input_id % 90
        tensors = (
            ("text_input", "BYTES", [1, 1], (1).to_bytes(4, "little") + bytes([byte])),
            ("max_tokens", "INT32", [1, 1], max_tokens.to_bytes(4, "little")),
            ("stream", "BOOL", [1, 1], b"\x01"),
            ("end_id", "INT32", [1, 1], byte.to_bytes(4, "little")),
            ("return_num_output_tokens", "BOOL", [1, 1], b"\x01"),
        )
    for name, datatype, shape, raw in tensors:
        tensor = request.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend(shape)
        request.raw_input_contents.append(raw)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


class _Request:
    """Reads one request's responses off its call; checks tokens; records timings."""

    __slots__ = ("base", "expected", "max_tokens", "sent", "first", "last", "final")

    def __init__(self, last_input_id: int, max_tokens: int) -> None:
        self.base = last_input_id + 1
        self.expected = 0
        self.max_tokens = max_tokens
        self.sent = 0.0
        self.first = 0.0
        self.last = 0.0
        self.final = False


async def _read(call, state: _Request, plan: Plan, result: WorkerResult, is_load: bool) -> None:
    """Consume responses until this request's final one."""
    w0, w1 = plan.w0, plan.w1
    while True:
        message = await call.read()
        if message is grpc.aio.EOF:
            raise ConnectionError("stream ended before the final response")
        now = time.monotonic()
        if message.error_message:
            raise RuntimeError(message.error_message)
        response = message.infer_response
        count = 0
        if response.outputs:
            for index, output in enumerate(response.outputs):
                if output.name == "output_ids":
                    raw = response.raw_output_contents[index]
                    count = len(raw) >> 2
                    if count and int.from_bytes(raw[:4], "little", signed=True) != (state.base + state.expected) % VOCAB_SIZE:
                        raise AssertionError(f"token {state.expected}: got {int.from_bytes(raw[:4], 'little')}")
                    break
                if output.name == "num_output_tokens":  # text requests: tokens so far
                    count = int.from_bytes(response.raw_output_contents[index][:4], "little", signed=True) - state.expected
                    break
        if count:
            state.expected += count
            result.tokens_total += count
            if w0 <= now < w1:
                result.tokens += count
                result.responses += 1
                if is_load:
                    result.lags.append(now - state.sent - state.expected * plan.step_s)
                    if state.last >= w0:
                        result.gaps.append(now - state.last)
            if not state.first:
                state.first = now
            state.last = now
        final = response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            state.final = True
            if state.expected != state.max_tokens and not is_load:
                raise AssertionError(f"{state.expected} tokens, expected {state.max_tokens}")
            return


async def _load_stream(stub, plan: Plan, index: int, result: WorkerResult) -> None:
    call = stub.ModelStreamInfer()
    last_input_id = (plan.first_input_id + index * 7919) % VOCAB_SIZE
    state = _Request(last_input_id, plan.load_tokens)
    request = _request(plan.model, f"load-{plan.first_input_id}-{index}", last_input_id, plan.load_tokens, plan.text)
    await asyncio.sleep(max(0.0, plan.start - time.monotonic()))
    state.sent = time.monotonic()
    await call.write(request)
    try:
        await _read(call, state, plan, result, is_load=True)
        if time.monotonic() < plan.w1:
            result.errors.append(f"load request {index} ended inside the window ({state.expected} tokens)")
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 - reported, not raised: one bad stream must not hide the others
        result.errors.append(f"load stream {index}: {type(exc).__name__}: {exc}")
    finally:
        if state.first:
            result.burst_ttft.append(state.first - state.sent)
        call.cancel()


async def _probe_stream(stub, plan: Plan, result: WorkerResult) -> None:
    call = stub.ModelStreamInfer()
    await asyncio.sleep(max(0.0, plan.start - time.monotonic()))
    number = 0
    state = None
    try:
        while time.monotonic() < plan.w1:
            last_input_id = (number * 31 + 5) % VOCAB_SIZE
            state = _Request(last_input_id, plan.probe_tokens)
            request = _request(plan.model, f"probe-{number}", last_input_id, plan.probe_tokens, plan.text)
            state.sent = time.monotonic()
            await call.write(request)
            await _read(call, state, plan, result, is_load=False)
            if plan.w0 <= state.sent < plan.w1:
                result.ttft.append(state.first - state.sent)
                result.probe_requests += 1
            number += 1
            if plan.probe_pause_s:
                await asyncio.sleep(plan.probe_pause_s)
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001
        result.errors.append(f"probe stream: {type(exc).__name__}: {exc}")
    finally:
        if state is not None and not state.first and state.sent < plan.w1:
            result.ttft.append(time.monotonic() - state.sent)  # a lower bound: it never came
            result.ttft_censored += 1
        call.cancel()


async def _run(plan: Plan) -> WorkerResult:
    result = WorkerResult()
    options = [("grpc.max_receive_message_length", 64 << 20)]
    # Several channels (TCP connections): one HTTP/2 connection's flow control is not what we measure.
    channels = [grpc.aio.insecure_channel(plan.url, options=options + [("grpc.channel_id", i)]) for i in range(plan.channels)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
    try:
        await asyncio.wait_for(asyncio.gather(*(channel.channel_ready() for channel in channels)), timeout=10)
    except asyncio.TimeoutError:
        result.errors.append(f"could not connect to {plan.url} in 10 s")
        return result
    if time.monotonic() > plan.start:
        result.errors.append(f"worker ready {time.monotonic() - plan.start:.2f} s after the start time (raise --connect-s)")
    tasks = [asyncio.ensure_future(_load_stream(stubs[i % len(stubs)], plan, i, result)) for i in range(plan.load_streams)]
    if plan.probe:
        tasks.append(asyncio.ensure_future(_probe_stream(stubs[-1], plan, result)))
    await asyncio.sleep(max(0.0, plan.w0 - time.monotonic()))
    cpu0 = _cpu_s()
    await asyncio.sleep(max(0.0, plan.w1 - time.monotonic()))
    result.cpu_s = _cpu_s() - cpu0
    await asyncio.sleep(0.05)  # let the probe finish a request in progress at w1 (its TTFT counts)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    return result


def run_worker(plan: Plan) -> WorkerResult:
    """Entry point of a worker process."""
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    return asyncio.run(_run(plan))
