"""What one engine step batch costs across the worker-process boundary (executors/engine_wire.py): encode on the
worker's side plus decode back into Step objects on the stub's, for N requests each gaining one token, in the
columnar form against the former one (a pickle of every Step as the tuple of its fields). Prints the median
microseconds of each side, the bytes on the wire and the ratios, all measured in this run.

Run: `.venv/bin/python bench/engine_wire.py` (a few seconds); `--requests 1024 --log-probs` for other shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.executor_interface import Step  # noqa: E402
from trtllm_model.executors.engine_wire import Progress, decode, encode, pack_steps, unpack_steps  # noqa: E402

_STEP_FIELDS = tuple(field.name for field in dataclasses.fields(Step))


class _StepTuplePickler(pickle.Pickler):
    """The former wire format: each Step pickled as (Step, its field values)."""

    def reducer_override(self, obj):
        if type(obj) is Step:
            return Step, tuple(getattr(obj, name) for name in _STEP_FIELDS)
        return NotImplemented


def old_encode(steps: list[Step]) -> bytes:
    out = io.BytesIO()
    _StepTuplePickler(out, protocol=5).dump(("steps", steps, [], 0, 0))
    return out.getvalue()


def old_decode(data: bytes) -> list[Step]:
    return pickle.loads(data)[1]


def new_encode(steps: list[Step]) -> list[bytes]:
    return [bytes(frame) for frame in encode(("steps", pack_steps(steps), [], Progress(1, True, 0, 0)))]


def new_decode(frames: list[bytes]) -> list[Step]:
    return unpack_steps(decode(frames)[1])


def timed(function, argument) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(argument)
    return time.perf_counter() - started, result


def medians_us(steps: list[Step], repeats: int) -> dict[str, float]:
    """Median microseconds of each side of each format, timed in turn (a noisy host slows all of them alike)."""
    times: dict[str, list[float]] = {"old encode": [], "old decode": [], "new encode": [], "new decode": []}
    for _ in range(repeats):
        seconds, data = timed(old_encode, steps)
        times["old encode"].append(seconds)
        times["old decode"].append(timed(old_decode, data)[0])
        seconds, frames = timed(new_encode, steps)
        times["new encode"].append(seconds)
        times["new decode"].append(timed(new_decode, frames)[0])
    return {name: statistics.median(values) * 1e6 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--log-probs", action="store_true", help="each step with its log prob and cumulative one")
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    steps = [Step(1000 + i, [(i * 7919) % 49152], log_probs=[-0.25] if args.log_probs else None,
                  cum_log_prob=-0.25 * i if args.log_probs else None) for i in range(args.requests)]
    old_data, new_frames = old_encode(steps), new_encode(steps)
    assert old_decode(old_data) == steps and new_decode(new_frames) == steps
    us = medians_us(steps, args.repeats)
    old_us, new_us = us["old encode"] + us["old decode"], us["new encode"] + us["new decode"]
    new_bytes = sum(len(frame) for frame in new_frames)
    print(f"{args.requests} requests, one token each{', with log probs' if args.log_probs else ''}; "
          f"medians of {args.repeats}, in turn; encode = the worker's side, decode to Steps = the stub's")
    print(f"  pickled Steps : encode {us['old encode']:7.1f} us  decode {us['old decode']:7.1f} us  "
          f"total {old_us:7.1f} us  {len(old_data):6d} bytes")
    print(f"  columnar      : encode {us['new encode']:7.1f} us  decode {us['new decode']:7.1f} us  "
          f"total {new_us:7.1f} us  {new_bytes:6d} bytes")
    print(f"  old / new     : encode {us['old encode'] / us['new encode']:5.2f} x  decode "
          f"{us['old decode'] / us['new decode']:5.2f} x  total {old_us / new_us:5.2f} x  "
          f"bytes {len(old_data) / new_bytes:5.2f} x")

if __name__ == "__main__":
    main()
