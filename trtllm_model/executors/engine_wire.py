"""The messages between the stubs and their engine worker (engine_client.py, engine_worker.py), and their encoding.

The worker binds one command socket; each stub binds its own event socket and says hello. Several stubs (instances
of one model on one device) may share one worker: each has a number, and its request ids carry it in their high bits
(`CLIENT_ID_SHIFT`), so the worker sends each stub the steps of its own requests.

  stub -> worker   ("spec", EngineSpec) once, from the stub that starts the worker; ("hello", pid, events address,
                   capacity, answer by: a time.monotonic() past which the stub no longer waits, and the worker
                   ignores the hello) from every stub (the starting one right after the spec); then ("submits", [(id, encoded
                   GenerationRequest), ...]), ("cancel", id), ("bye", number): one submits message carries the requests
                   of one `execute()` batch, or one request; the worker decodes each request apart, so that one it
                   cannot decode fails alone
  worker -> stub   to a hello: ("ready", WorkerInfo, number), ("failed", message) when the model did not load, or
                   ("full",) once `capacity` stubs have attached in its life (the stubs of a reload get a worker of
                   their own); then ("steps", PackedSteps, stats, Progress): the steps of this stub's requests and (to one
                   stub only, so that they are counted once) the iteration stats since the previous message, one
                   message per wake-up, and at least one every HEARTBEAT_S even when idle (the heartbeat); ("dead",
                   message) when the engine stops on a failure; ("gone", stubs left) to a bye. The worker stops once no
                   stub is left (a stub whose process ended has left, and its requests are cancelled).

A message is a pickle (protocol 5) of plain tuples and dataclasses sent as one zmq multipart message. A batch of
steps travels as columns (`PackedSteps`: a few plain lists, which pickle packs in C, whatever the number of requests)
with a side list for the rare per-step extras (an error, logits, KV block counts); numpy arrays of OUT_OF_BAND_BYTES
or more (logits) are frames of their own beside the pickle, not copied into it.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from dataclasses import dataclass

import zmq

from ..executor_interface import FinishReason, GenerationRequest, IterationStats, Step

HEARTBEAT_S = 1.0  # the worker sends at least one message this often once ready
CLIENT_ID_SHIFT = 40  # a stub's request ids are its number << CLIENT_ID_SHIFT plus its own count
OUT_OF_BAND_BYTES = 64 * 1024


@dataclass(slots=True)
class EngineSpec:
    """What the worker needs to load the model and build the engine (from config.pbtxt parameters)."""

    model_dir: str | None = None
    tokenizer_dir: str | None = None
    cache_dir: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    torch_threads: int | None = None  # None: follow the free cores (embedded/cpu_share.py)
    max_batch_size: int = 64
    max_num_tokens: int = 2048
    kv_cache_memory_bytes: int | None = None
    kv_cache_free_gpu_mem_fraction: float | None = None
    stats_max_iterations: int = 1000
    enable_kv_cache_reuse: bool = True
    cuda_graphs: bool = True  # on CUDA; ignored on CPU
    guide_compile_timeout_s: float = 10.0  # the worker compiles guides (embedded/guided.py), within this
    max_guide_cache_bytes: int = 64 * 1024 * 1024  # and keeps them, this many bytes of grammars at most
    prefill_stall_factor: float = 0.0  # embedded/step_budget.py
    overlap_steps: bool | None = None  # embedded/engine.py; None: on CUDA only
    fused_forward: bool | None = None  # embedded/fused_forward.py; None: where the model is supported
    decode_steps: int | None = None  # embedded/engine.py; None: the device's default (engine.default_decode_steps)
    deterministic: bool | None = None  # embedded/invariant_attention.py; None: on the CPU


@dataclass(slots=True)
class WorkerInfo:
    """What the stub's request checks need from the loaded model."""

    vocab_size: int
    max_positions: int
    kv_bytes_per_token: int
    kv_cache_memory_bytes: int
    generation_eos_id: int | None
    source: str
    pid: int


@dataclass(slots=True)
class Progress:
    """The worker's state with every steps message (and so with every heartbeat)."""

    iteration: int  # engine iterations done: the stub's evidence that a busy engine moves
    busy: bool  # requests wait, prefill or decode in the worker
    queued: int  # requests waiting for admission (guides compiling included)
    submits_seen: int  # submits of this stub the worker had received when it sent this


# -- a batch of steps, columnar -------------------------------------------------------------------------------------
_REASONS = list(FinishReason)
_REASON_INDEX = {reason: index for index, reason in enumerate(_REASONS)}
_NOT_FINISHED = FinishReason.NOT_FINISHED
# Step fields that are unset on nearly every step; a step with any of them set carries them in `extras`.
_EXTRA_DEFAULTS = {"error": None, "client_error": False, "sequence_index": 0, "beams": None, "beam_log_probs": None,
                   "beam_cum_log_probs": None, "context_logits": None, "generation_logits": None,
                   "kv_cache_alloc_new_blocks": None, "kv_cache_reused_blocks": None,
                   "kv_cache_alloc_total_blocks": None, "top_log_probs": None}


@dataclass(slots=True)
class PackedSteps:
    """Steps as columns: step i is request_ids[i] gaining token_ids[i]. Plain lists: pickle packs a list of ints in C,
    where numpy arrays had to be built from the steps in Python first (the worker's side of a batch of 256 one-token
    steps: 76 against 142 us, bench/engine_wire.py)."""

    request_ids: list[int]
    token_ids: list[list[int]]
    is_final: list[bool]
    finish_reasons: list[int]  # index into FinishReason
    log_probs: list[list[float] | None] | None  # None when no step has them
    cum_log_probs: list[float | None] | None  # None when no step has one
    extras: list[tuple[int, dict]]  # (step index, {field: value}) for the rare fields


def pack_steps(steps: list[Step]) -> PackedSteps:
    log_probs = [step.log_probs for step in steps]
    cum = [step.cum_log_prob for step in steps]
    return PackedSteps(
        request_ids=[step.request_id for step in steps],
        token_ids=[step.token_ids for step in steps],
        is_final=[step.is_final for step in steps],
        finish_reasons=[0 if step.finish_reason is _NOT_FINISHED else _REASON_INDEX[step.finish_reason]
                        for step in steps],
        log_probs=None if log_probs.count(None) == len(steps) else log_probs,
        cum_log_probs=None if cum.count(None) == len(steps) else cum,
        extras=[(index, _extras_of(step)) for index, step in enumerate(steps)
                if step.error is not None or step.generation_logits is not None or step.context_logits is not None
                or step.kv_cache_alloc_new_blocks is not None or step.kv_cache_reused_blocks is not None
                or step.kv_cache_alloc_total_blocks is not None or step.beams is not None or step.sequence_index
                or step.client_error or step.beam_log_probs is not None or step.beam_cum_log_probs is not None
                or step.top_log_probs is not None],
    )


def _extras_of(step: Step) -> dict:
    extra = {}
    for name, default in _EXTRA_DEFAULTS.items():
        value = getattr(step, name)
        if (value is not None) if default is None else (value != default):  # never == on an array
            extra[name] = value
    return extra


def unpack_steps(packed: PackedSteps) -> list[Step]:
    """The Step objects again (the poller's interface), field for field as packed."""
    reasons = _REASONS
    columns = (packed.request_ids, packed.token_ids, packed.is_final, packed.finish_reasons)
    if packed.log_probs is None and packed.cum_log_probs is None:
        steps = [Step(request_id, tokens, final, reasons[reason]) for request_id, tokens, final, reason in zip(*columns)]
    else:
        nothing = [None] * len(packed.request_ids)
        steps = [Step(request_id, tokens, final, reasons[reason], log_probs, cum)
                 for request_id, tokens, final, reason, log_probs, cum
                 in zip(*columns, packed.log_probs or nothing, packed.cum_log_probs or nothing)]
    for index, extra in packed.extras:
        for name, value in extra.items():
            setattr(steps[index], name, value)
    return steps


# -- encoding -------------------------------------------------------------------------------------------------------
class _Pickler(pickle.Pickler):
    """Iteration stats and requests as the tuple of their fields: no field names, so a thousand stats stay small and a
    request decodes in the worker in half the time, in 0.4x the bytes (bench/engine_wire.py)."""

    def reducer_override(self, obj):
        fields = _COMPACT.get(type(obj))
        if fields is None:
            return NotImplemented
        return type(obj), tuple(getattr(obj, name) for name in fields)


# Every field is an __init__ argument, in order: the class called with the tuple rebuilds the object.
_COMPACT = {kind: tuple(field.name for field in dataclasses.fields(kind))
            for kind in (IterationStats, GenerationRequest)}


def encode(message: tuple) -> list:
    """Frames of one message: the pickle, then each large buffer (logits) out of band."""
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_BYTES:
            return True  # in the pickle
        buffers.append(buffer)
        return False

    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=out_of_band).dump(message)
    return [out.getbuffer(), *(buffer.raw() for buffer in buffers)]


def decode(frames: list) -> tuple:
    return pickle.loads(frames[0], buffers=frames[1:])


def encode_request(request: GenerationRequest) -> bytes:
    """A request as one pickle, on the thread that enqueues it (one that cannot be encoded fails its own enqueue). Its
    arrays go inside it: a submits message is then one frame, and pyzmq lets go of the interpreter's lock once a
    frame."""
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(request)
    return out.getvalue()


def decode_request(encoded: bytes) -> GenerationRequest:
    return pickle.loads(encoded)


def new_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # never block a sender; both ends drain promptly
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock
