"""torch intra-op threads for the cores nobody else is using.

torch starts one intra-op thread per core and every parallel region waits for its slowest thread. Beside a process
that keeps one of two cores busy, the thread on that core gets half of it and each region waits for it: a 16-token
request took 4x as long (issue 24). `FreeCoreThreads` measures, once a second, how much of the cores this process
may run on (its affinity) went to other processes, and before each forward of the model sets the engine thread's
intra-op threads to the cores left free (at least one).
"""

from __future__ import annotations

import os
import threading
import time

import torch

SAMPLE_S = 1.0
# Another process's share of a core above this counts as a busy core (a stub sending tokens at 0.5 core does not).
BUSY_CORE_SHARE = 0.7


def busy_jiffies(cpus: set[int], stat_text: str) -> int:
    """Non-idle jiffies of `cpus` summed from /proc/stat's text (idle and iowait are the 4th and 5th fields)."""
    total = 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        fields = [int(value) for value in rest.split()]
        total += sum(fields[:8]) - fields[3] - fields[4]  # user..steal, less idle and iowait
    return total


def threads_for(cores: int, busy_elsewhere: float) -> int:
    """Intra-op threads for `cores` usable cores of which `busy_elsewhere` cores' worth went to other processes."""
    return max(1, cores - int(busy_elsewhere + (1.0 - BUSY_CORE_SHARE)))


class FreeCoreThreads:
    """Samples other processes' CPU use on this process's cores; `apply()` (on the engine thread) sets the threads."""

    def __init__(self, cpus: set[int] | None = None, sample_s: float = SAMPLE_S) -> None:
        self.cpus = cpus or os.sched_getaffinity(0)
        self.threads = len(self.cpus)
        self._sample_s = sample_s
        self._applied: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="cpu-share", daemon=True)

    def start(self) -> FreeCoreThreads:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def attach(self, model: torch.nn.Module) -> None:
        """Apply before every forward of `model`, on whichever thread runs it (intra-op threads are per thread). The
        hook sits on the input embeddings, which transformers' forward and `fused_forward`'s (which never calls the
        model's own forward) both call first."""
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model
        embeddings.register_forward_pre_hook(lambda *_: self.apply())

    def apply(self) -> None:
        if self.threads != self._applied:
            torch.set_num_threads(self.threads)
            self._applied = self.threads

    def _sample(self) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        before_busy, before_own, before_t = self._read()
        while not self._stop.wait(self._sample_s):
            busy, own, now = self._read()
            elapsed = now - before_t
            if elapsed > 0:
                elsewhere = max(0.0, (busy - before_busy) / ticks - (own - before_own)) / elapsed
                self.threads = threads_for(len(self.cpus), elsewhere)
            before_busy, before_own, before_t = busy, own, now

    def _read(self) -> tuple[int, float, float]:
        with open("/proc/stat") as stat:
            text = stat.read()
        times = os.times()
        return busy_jiffies(self.cpus, text), times.user + times.system, time.monotonic()
