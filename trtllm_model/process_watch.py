"""The server's processes seen from outside: a process that must not outlive another one, Python backend stubs that
died without Triton finalizing them, and the end of tritonserver's process group.

Linux only (pidfds and /proc), as tritonserver is. No Triton objects here: `trtllm-triton serve`, the stubs' model
and the engine worker use these.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# /proc/<pid>/comm of tritonserver's Python backend stubs ("triton_python_backend_stub", cut to 15 characters).
STUB_COMM = "triton_python_b"
STUB_INSTANCE_ARG = 8  # the stub's argv: binary, model.py, shm region, sizes (2), parent pid, lib dir, IPC handle, instance


def exit_when_ended(pid: int, what: str, before_exit: Callable[[], None] | None = None) -> bool:
    """On a daemon thread: end this process at once (os._exit(1)) when process `pid` ends, after `before_exit`. The
    wait is a pidfd in select(), which holds no lock and no interpreter lock. False when `pid` is already gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False

    def watch() -> None:
        select.select([pidfd], [], [])
        log.error("%s (pid %d) ended: this process (pid %d) ends with it", what, pid, os.getpid())
        if before_exit is not None:
            with contextlib.suppress(Exception):
                before_exit()
        os._exit(1)

    threading.Thread(target=watch, name=f"exit-with-{pid}", daemon=True).start()
    return True


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid` (from /proc), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return int(file.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class Stub:
    pid: int
    instance: str  # the model instance it serves ("tensorrt_llm_0_1"); "" when its command line was never read
    zombie: bool  # it has exited and its parent has not collected it


def stubs_of(server_pid: int, known: dict[int, str] | None = None) -> list[Stub]:
    """The Python backend stubs that are children of `server_pid`. `known` (pid -> instance) keeps the instance of each
    stub seen alive: an exited stub's command line reads empty."""
    stubs = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as file:
                comm, rest = file.read().split("(", 1)[1].rsplit(")", 1)
            state, parent = rest.split()[:2]
            if int(parent) != server_pid or comm != STUB_COMM:
                continue
            if known is not None and pid not in known and state != "Z":
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    args = file.read().split(b"\0")
                known[pid] = args[STUB_INSTANCE_ARG].decode(errors="replace") if len(args) > STUB_INSTANCE_ARG else ""
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        stubs.append(Stub(pid, (known or {}).get(pid, ""), state == "Z"))
    return stubs


class LostStubWatch:
    """Python backend stubs of tritonserver `server_pid` that died while it runs (killed, crashed).

    Triton 2.51 collects a stub's exit only when it finalizes that model instance (an unload or the server's stop), and
    it never restarts a decoupled model's stub: a stub that died otherwise stays a zombie child of tritonserver. Its
    model stays READY, Triton keeps handing that instance requests ("Stub process ... is not healthy"), and the
    requests it had taken never get their final response: their response factories were the stub's to release, so the
    model never unloads either. A zombie seen on two looks `period_s` apart is such a stub (a finalized stub is
    collected at once: Triton waits for its exit)."""

    def __init__(self, server_pid: int, period_s: float = 0.5) -> None:
        self.server_pid = server_pid
        self.period_s = period_s
        self._instances: dict[int, str] = {}
        self._zombies: set[int] = set()

    def lost(self) -> list[Stub]:
        """Look once; the stubs that were zombies at the last look too."""
        stubs = stubs_of(self.server_pid, self._instances)
        zombies = {stub.pid for stub in stubs if stub.zombie}
        lost = [stub for stub in stubs if stub.pid in zombies & self._zombies]
        self._zombies = zombies
        return lost

    def wait_lost(self, stop: threading.Event) -> list[Stub]:
        """Look now and every `period_s` until a stub is lost (its list) or `stop` is set (an empty list)."""
        while True:
            lost = self.lost()
            if lost:
                return lost
            if stop.wait(self.period_s):
                return []


def end_process_group(pgid: int, grace_s: float) -> list[int]:
    """SIGKILL what is left of process group `pgid` once `grace_s` has passed without it emptying (the engine worker
    leaves on its own once its last stub has left; a stub ignores SIGTERM); the pids that were killed."""
    deadline = time.monotonic() + grace_s
    while True:
        left = [pid for pid in _group_members(pgid) if not _zombie(pid)]
        if not left:
            return []
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return left
        time.sleep(0.05)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:  # after the name: state, parent, process group
                    members.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return members


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
