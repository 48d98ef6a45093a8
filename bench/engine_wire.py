"""What one engine step batch costs across the worker-process boundary (executors/engine_wire.py): encode on the
worker's side (the engine's thread) plus decode back into Step objects on the stub's, for N requests each gaining one
token, in today's form (columns as plain lists) against the two before it, numpy columns (2026-12-03 to 12-05) and a
pickle of every Step as the tuple of its fields (before), and one tried and not kept (flat lists: every token in one
list, each step's count beside it). Prints the median microseconds of each side, the bytes on
the wire and the ratios, all measured in this run. Then the other way, one request's submit message (stub -> worker):
today (the request as the tuple of its fields) against the request pickled with its field names (before 2026-12-05
12:40 UTC: the same encoder, the request left to pickle's own dataclass reduction).

Run: `.venv/bin/python bench/engine_wire.py` (a few seconds); `--requests 1024 --log-probs` for other shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.executor_interface import FinishReason, GenerationRequest, Step  # noqa: E402
from trtllm_model.executors import engine_wire  # noqa: E402
from trtllm_model.executors.engine_wire import Progress, decode, encode, pack_steps, unpack_steps  # noqa: E402

_STEP_FIELDS = tuple(field.name for field in dataclasses.fields(Step))
_REASONS = list(FinishReason)
_REASON_INDEX = {reason: index for index, reason in enumerate(_REASONS)}


class _StepTuplePickler(pickle.Pickler):
    """The first wire format: each Step pickled as (Step, its field values)."""

    def reducer_override(self, obj):
        if type(obj) is Step:
            return Step, tuple(getattr(obj, name) for name in _STEP_FIELDS)
        return NotImplemented


def pickled_encode(steps: list[Step]) -> list[bytes]:
    out = io.BytesIO()
    _StepTuplePickler(out, protocol=5).dump(("steps", steps, [], 0, 0))
    return [out.getvalue()]


def pickled_decode(frames: list[bytes]) -> list[Step]:
    return pickle.loads(frames[0])[1]


def rare_fields(steps: list[Step]) -> tuple:
    """What every packer checks beside the columns (as engine_wire.pack_steps does): whether any step has log probs,
    and which steps carry rare fields."""
    return ([step.log_probs for step in steps].count(None), [step.cum_log_prob for step in steps].count(None),
            [index for index, step in enumerate(steps)
             if step.error is not None or step.generation_logits is not None or step.context_logits is not None
             or step.kv_cache_alloc_new_blocks is not None or step.kv_cache_reused_blocks is not None
             or step.kv_cache_alloc_total_blocks is not None or step.beams is not None or step.sequence_index
             or step.client_error or step.beam_log_probs is not None or step.beam_cum_log_probs is not None])


def numpy_encode(steps: list[Step]) -> list[bytes]:
    """The second: numpy columns (one-token steps without log probs or extras, the case measured here)."""
    count = len(steps)
    starts = list(itertools.accumulate([len(step.token_ids) for step in steps], initial=0))
    columns = (np.fromiter([step.request_id for step in steps], np.int64, count), np.asarray(starts, np.int64),
               np.fromiter(itertools.chain.from_iterable([step.token_ids for step in steps]), np.int32, starts[-1]),
               np.fromiter([step.is_final for step in steps], np.bool_, count),
               np.fromiter([_REASON_INDEX[step.finish_reason] for step in steps], np.int8, count), rare_fields(steps))
    return [bytes(frame) for frame in encode(("steps", columns, [], Progress(1, True, 0, 0)))]


def numpy_decode(frames: list[bytes]) -> list[Step]:
    request_ids, starts, tokens, finals, reasons, _ = decode(frames)[1]
    tokens, starts = tokens.tolist(), starts.tolist()
    return [Step(request_id, tokens[start:end], final, _REASONS[reason]) for request_id, start, end, final, reason
            in zip(request_ids.tolist(), starts, starts[1:], finals.tolist(), reasons.tolist())]


def lists_encode(steps: list[Step]) -> list[bytes]:
    return [bytes(frame) for frame in encode(("steps", pack_steps(steps), [], Progress(1, True, 0, 0)))]


def lists_decode(frames: list[bytes]) -> list[Step]:
    return unpack_steps(decode(frames)[1])


def flat_encode(steps: list[Step]) -> list[bytes]:
    """Tried: today's columns with every token in one flat list and each step's count beside it."""
    tokens = [step.token_ids for step in steps]
    columns = ([step.request_id for step in steps], list(map(len, tokens)), list(itertools.chain.from_iterable(tokens)),
               [step.is_final for step in steps], [_REASON_INDEX[step.finish_reason] for step in steps],
               rare_fields(steps))
    return [bytes(frame) for frame in encode(("steps", columns, [], Progress(1, True, 0, 0)))]


def flat_decode(frames: list[bytes]) -> list[Step]:
    request_ids, counts, tokens, finals, reasons, _ = decode(frames)[1]
    ends = itertools.accumulate(counts)
    return [Step(request_id, tokens[end - count:end], final, _REASONS[reason])
            for request_id, count, end, final, reason in zip(request_ids, counts, ends, finals, reasons)]


FORMATS = {"lists (today)": (lists_encode, lists_decode), "flat lists": (flat_encode, flat_decode),
           "numpy columns": (numpy_encode, numpy_decode), "pickled Steps": (pickled_encode, pickled_decode)}


def timed(function, argument) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(argument)
    return time.perf_counter() - started, result


def medians_us(forms: dict, message, repeats: int) -> dict[str, tuple[float, float]]:
    """Median microseconds (encode, decode) of each form, timed in turn (a noisy host slows all of them alike)."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in forms}
    for _ in range(repeats):
        for name, (encoder, decoder) in forms.items():
            seconds, frames = timed(encoder, message)
            times[name][0].append(seconds)
            times[name][1].append(timed(decoder, frames)[0])
    return {name: (statistics.median(encodes) * 1e6, statistics.median(decodes) * 1e6)
            for name, (encodes, decodes) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--log-probs", action="store_true", help="each step with its log prob and cumulative one "
                        "(the numpy and flat columns' rows are then left out: they are written for steps without them)")
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    steps = [Step(1000 + i, [(i * 7919) % 49152], log_probs=[-0.25] if args.log_probs else None,
                  cum_log_prob=-0.25 * i if args.log_probs else None) for i in range(args.requests)]
    if args.log_probs:
        del FORMATS["numpy columns"], FORMATS["flat lists"]
    sizes = {}
    for name, (encoder, decoder) in FORMATS.items():
        frames = encoder(steps)
        assert decoder(frames) == steps, name
        sizes[name] = sum(len(frame) for frame in frames)
    us = medians_us(FORMATS, steps, args.repeats)
    print(f"{args.requests} requests, one token each{', with log probs' if args.log_probs else ''}; "
          f"medians of {args.repeats}, in turn; encode = the worker's side, decode to Steps = the stub's")
    today_encode, today_decode = us["lists (today)"]
    for name, (encode_us, decode_us) in us.items():
        ratios = "" if name == "lists (today)" else (
            f"   it / today: encode {encode_us / today_encode:5.2f} x  decode {decode_us / today_decode:5.2f} x  "
            f"total {(encode_us + decode_us) / (today_encode + today_decode):5.2f} x")
        print(f"  {name:<14}: encode {encode_us:7.1f} us  decode {decode_us:7.1f} us  total {encode_us + decode_us:7.1f}"
              f" us  {sizes[name]:6d} bytes{ratios}")
    submit_us(args.repeats)


class _ByNamePickler(engine_wire._Pickler):
    """engine_wire's encoder as it was before requests went as the tuple of their fields."""

    def reducer_override(self, obj):
        if type(obj) is GenerationRequest:
            return NotImplemented
        return super().reducer_override(obj)


def encode_by_name(message: tuple) -> list:
    out = io.BytesIO()
    _ByNamePickler(out, protocol=5).dump(message)
    return [out.getbuffer()]


def submit_us(repeats: int) -> None:
    """One chat request's submit message, today's encoding against the one before (the same message otherwise)."""
    request = GenerationRequest(input_ids=list(range(100, 220)), max_tokens=64, min_tokens=64, end_id=2)
    message = ("submit", 7, request)
    forms = {"fields (today)": (encode, decode), "by name (before)": (encode_by_name, decode)}
    us = medians_us(forms, message, repeats)
    print(f"a submit message (a request of {len(request.input_ids)} prompt tokens), medians of {repeats}, in turn; "
          "encode = the stub's side, decode = the worker's")
    for name, (encoder, decoder) in forms.items():
        frames = encoder(message)
        assert decoder(frames) == message, name
        encode_us, decode_us = us[name]
        print(f"  {name:<16}: encode {encode_us:7.1f} us  decode {decode_us:7.1f} us  "
              f"{sum(len(frame) for frame in frames):6d} bytes")


if __name__ == "__main__":
    main()
