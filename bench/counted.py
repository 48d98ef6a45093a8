"""Count the tokens an executor generates, for bench/serving.py, without touching the model's hot path much.

`count_generated(executor)` wraps the executor instance's `await_steps`: after each call it adds the steps'
token counts to a 64-bit counter in a small file mapped into memory (path: $BENCH_COUNTER_FILE), which the
benchmark reads at the start and the end of a measurement window. One add and one 8-byte write per await call.
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
    inner = executor.await_steps
    total = 0

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
