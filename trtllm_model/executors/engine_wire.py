"""The messages between the stub and its engine worker (engine_client.py, engine_worker.py), and their encoding.

  stub -> worker   ("spec", EngineSpec) once, then ("submit", id, GenerationRequest), ("cancel", id), ("stop",)
  worker -> stub   ("ready", WorkerInfo) or ("failed", message) once, then ("steps", PackedSteps, stats, Progress):
                   every step and iteration stat the engine published since the previous message, one message per
                   wake-up, and at least one every HEARTBEAT_S even when idle (the heartbeat); ("dead", message) when
                   the engine stops on a failure.

A message is a pickle (protocol 5) of plain tuples and dataclasses sent as one zmq multipart message. A batch of
steps travels columnar (`PackedSteps`: a few flat numpy arrays, whatever the number of requests) with a side list
for the rare per-step extras (an error, logits, KV block counts); numpy arrays of OUT_OF_BAND_BYTES or more
(logits) are frames of their own beside the pickle, not copied into it.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
import pickle
from dataclasses import dataclass

import numpy as np
import zmq

from ..executor_interface import FinishReason, IterationStats, Step

HEARTBEAT_S = 1.0  # the worker sends at least one message this often once ready
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
    prefill_stall_factor: float = 0.0  # embedded/step_budget.py
    overlap_steps: bool | None = None  # embedded/engine.py; None: on CUDA only
    fused_forward: bool | None = None  # embedded/fused_forward.py; None: where the model is supported


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
    submits_seen: int  # submits the worker had received when it sent this


# -- a batch of steps, columnar -------------------------------------------------------------------------------------
_REASONS = list(FinishReason)
_REASON_INDEX = {reason: index for index, reason in enumerate(_REASONS)}
_NOT_FINISHED = FinishReason.NOT_FINISHED
# Step fields that are unset on nearly every step; a step with any of them set carries them in `extras`.
_EXTRA_DEFAULTS = {"error": None, "client_error": False, "sequence_index": 0, "beams": None, "beam_log_probs": None,
                   "beam_cum_log_probs": None, "context_logits": None, "generation_logits": None,
                   "kv_cache_alloc_new_blocks": None, "kv_cache_reused_blocks": None,
                   "kv_cache_alloc_total_blocks": None}


@dataclass(slots=True)
class PackedSteps:
    """Steps as flat arrays: step i has tokens token_ids[offsets[i]:offsets[i + 1]] (and their log probs)."""

    request_ids: np.ndarray  # int64 [steps]
    offsets: np.ndarray  # int64 [steps + 1]
    token_ids: np.ndarray  # int32 [tokens]
    is_final: np.ndarray  # bool [steps]
    finish_reasons: np.ndarray  # int8 [steps]: index into FinishReason
    cum_log_probs: np.ndarray | None  # float64 [steps], NaN where a step has none; None when none has
    log_probs: np.ndarray | None  # float64 [tokens], NaN for the tokens of a step that has none; None when none has
    extras: list[tuple[int, dict]]  # (step index, {field: value}) for the rare fields


def pack_steps(steps: list[Step]) -> PackedSteps:
    count = len(steps)
    starts = list(itertools.accumulate([len(step.token_ids) for step in steps], initial=0))
    cum = [step.cum_log_prob for step in steps]
    log_probs = [step.log_probs for step in steps]
    extras = [(index, _extras_of(step)) for index, step in enumerate(steps)
              if step.error is not None or step.generation_logits is not None or step.context_logits is not None
              or step.kv_cache_alloc_new_blocks is not None or step.kv_cache_reused_blocks is not None
              or step.kv_cache_alloc_total_blocks is not None or step.beams is not None or step.sequence_index
              or step.client_error or step.beam_log_probs is not None or step.beam_cum_log_probs is not None]
    return PackedSteps(
        request_ids=np.fromiter([step.request_id for step in steps], np.int64, count),
        offsets=np.asarray(starts, np.int64),
        token_ids=np.fromiter(itertools.chain.from_iterable([step.token_ids for step in steps]), np.int32, starts[-1]),
        is_final=np.fromiter([step.is_final for step in steps], np.bool_, count),
        finish_reasons=np.fromiter([0 if step.finish_reason is _NOT_FINISHED else _REASON_INDEX[step.finish_reason]
                                    for step in steps], np.int8, count),
        cum_log_probs=None if cum.count(None) == count else np.array(
            [np.nan if value is None else value for value in cum], np.float64),
        log_probs=None if log_probs.count(None) == count else _aligned_log_probs(log_probs, starts, extras),
        extras=extras,
    )


def _extras_of(step: Step) -> dict:
    extra = {}
    for name, default in _EXTRA_DEFAULTS.items():
        value = getattr(step, name)
        if (value is not None) if default is None else (value != default):  # never == on an array
            extra[name] = value
    return extra


def _aligned_log_probs(log_probs: list, starts: list[int], extras: list[tuple[int, dict]]) -> np.ndarray:
    """One value per token; a step whose log probs do not match its tokens (or has none) travels in `extras`."""
    if None not in log_probs and all(len(values) == end - start > 0
                                     for values, start, end in zip(log_probs, starts, starts[1:])):
        return np.fromiter(itertools.chain.from_iterable(log_probs), np.float64, starts[-1])  # every step has them
    aligned = np.full(starts[-1], np.nan, np.float64)
    for index, values in enumerate(log_probs):
        if values is None:
            continue
        if len(values) == starts[index + 1] - starts[index] > 0:
            aligned[starts[index]:starts[index + 1]] = values
        else:
            extras.append((index, {"log_probs": values}))
    return aligned


def unpack_steps(packed: PackedSteps) -> list[Step]:
    """The Step objects again (the poller's interface), field for field as packed."""
    tokens = packed.token_ids.tolist()
    starts = packed.offsets.tolist()
    ends = starts[1:]
    reasons = _REASONS
    columns = (packed.request_ids.tolist(), starts, ends, packed.is_final.tolist(), packed.finish_reasons.tolist())
    if packed.log_probs is None and packed.cum_log_probs is None:
        steps = [Step(request_id, tokens[start:end], final, reasons[reason])
                 for request_id, start, end, final, reason in zip(*columns)]
    else:  # NaN (not equal to itself) marks a step without them
        values = packed.log_probs.tolist() if packed.log_probs is not None else [math.nan] * len(tokens)
        cum = packed.cum_log_probs.tolist() if packed.cum_log_probs is not None else [math.nan] * len(starts)
        steps = [Step(request_id, tokens[start:end], final, reasons[reason],
                      values[start:end] if end > start and values[start] == values[start] else None,
                      total if total == total else None)
                 for request_id, start, end, final, reason, total in zip(*columns, cum)]
    for index, extra in packed.extras:
        for name, value in extra.items():
            setattr(steps[index], name, value)
    return steps


# -- encoding -------------------------------------------------------------------------------------------------------
class _Pickler(pickle.Pickler):
    """Iteration stats as the tuple of their fields (no field names: a thousand stats stay small)."""

    def reducer_override(self, obj):
        fields = _COMPACT.get(type(obj))
        if fields is None:
            return NotImplemented
        return type(obj), tuple(getattr(obj, name) for name in fields)


_COMPACT = {kind: tuple(field.name for field in dataclasses.fields(kind)) for kind in (IterationStats,)}


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


def new_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # never block a sender; both ends drain promptly
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock
