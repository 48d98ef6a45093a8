"""Count the tokens an executor generates, for bench/serving.py, without touching the model's hot path much.

`count_generated(executor)` keeps a 64-bit counter in a small file mapped into memory (path:
$BENCH_COUNTER_FILE), which the benchmark reads at the start and the end of a measurement window.
For the synthetic executor it wraps the engine's own step (`_step`, on the engine thread, under the executor's
lock): the count is what the engine produced, whether or not anyone has taken it yet. (Counting in
`await_steps` instead would credit a model only when it takes the steps: a model stuck sending a backlog would
show nothing generated.) Other executors: counted as `await_steps` returns. One add and one 8-byte write per
engine step.
"""

from __future__ import annotations

import mmap
import os
import struct

_COUNTER = struct.Struct("<q")


def count_generated(executor) -> None:
    path = os.environ.get("BENCH_COUNTER_FILE")
    if not path:
        return
    with open(path, "r+b") as file:
        memory = mmap.mmap(file.fileno(), _COUNTER.size)
    total = 0
    if hasattr(executor, "_step") and hasattr(executor, "_ready"):  # the synthetic engine
        inner_step = executor._step

        def step():
            nonlocal total
            before = len(executor._ready)
            inner_step()
            total += len(executor._ready) - before  # one Step (one token) per active request
            _COUNTER.pack_into(memory, 0, total)

        executor._step = step
        return
    inner = executor.await_steps

    def await_steps(timeout_s):
        nonlocal total
        steps = inner(timeout_s)
        if steps:
            total += sum(len(step.token_ids) for step in steps)
            _COUNTER.pack_into(memory, 0, total)
        return steps

    executor.await_steps = await_steps


class CounterFile:
    """The benchmark's side: create the file, read the count."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "wb") as file:
            file.write(b"\0" * _COUNTER.size)
        self._file = open(path, "rb")  # noqa: SIM115 - kept open for the life of the counter
        self._memory = mmap.mmap(self._file.fileno(), _COUNTER.size, access=mmap.ACCESS_READ)

    def read(self) -> int:
        return _COUNTER.unpack_from(self._memory, 0)[0]

    def close(self) -> None:
        self._memory.close()
        self._file.close()
