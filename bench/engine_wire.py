"""What one engine step batch costs across the worker-process boundary (executors/engine_wire.py): encode on the
worker's side plus decode back into Step objects on the stub's, for N requests each gaining one token, in the
columnar form against the former one (a pickle of every Step as the tuple of its fields). Prints the median
microseconds of each, the bytes on the wire and the ratio, all measured in this run.

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


def old_round_trip(steps: list[Step]) -> tuple[list[Step], int]:
    out = io.BytesIO()
    _StepTuplePickler(out, protocol=5).dump(("steps", steps, [], 0, 0))
    data = out.getvalue()
    return pickle.loads(data)[1], len(data)


def new_round_trip(steps: list[Step]) -> tuple[list[Step], int]:
    frames = encode(("steps", pack_steps(steps), [], Progress(1, True, 0, 0)))
    size = sum(len(frame) for frame in frames)
    frames = [bytes(frame) for frame in frames]  # as zmq hands them over
    return unpack_steps(decode(frames)[1]), size


def median_us(round_trip, steps: list[Step], repeats: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        _, size = round_trip(steps)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--log-probs", action="store_true", help="each step with its log prob and cumulative one")
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    steps = [Step(1000 + i, [(i * 7919) % 49152], log_probs=[-0.25] if args.log_probs else None,
                  cum_log_prob=-0.25 * i if args.log_probs else None) for i in range(args.requests)]
    assert old_round_trip(steps)[0] == steps and new_round_trip(steps)[0] == steps
    old_us, old_bytes = median_us(old_round_trip, steps, args.repeats)
    new_us, new_bytes = median_us(new_round_trip, steps, args.repeats)
    print(f"{args.requests} requests, one token each{', with log probs' if args.log_probs else ''}; "
          f"median of {args.repeats} encode+decode round trips")
    print(f"  pickled Steps : {old_us:8.1f} us  {old_bytes:7d} bytes")
    print(f"  columnar      : {new_us:8.1f} us  {new_bytes:7d} bytes")
    print(f"  old / new     : {old_us / new_us:8.2f} x time  {old_bytes / new_bytes:5.2f} x bytes")


if __name__ == "__main__":
    main()
