"""The embedded engine in a worker process of its own, seen from the stub: `EngineProcess`, so that the engine's
steps do not share the stub's interpreter (and GIL) with the poller's sends (issue 24; TensorRT-LLM's LLM API and
vLLM's V1 run their engines the same way).

The stub keeps request checks, the tokenizer and everything Triton; the worker (engine_worker.py, in a fresh
interpreter with the stub's sys.path) loads the model from the same parameters, runs the `Engine` and compiles
guides. Transport: pyzmq PUSH/PULL over ipc:// sockets in private directories; the messages are in engine_wire.py.

Several stubs share one worker when they are given the same `shared_as` and spec: the instances of one model on one
device (model.py), each with its own interpreter lock for its `execute()` and its sends, and one engine batching all
their requests. The first to take the rendezvous lock starts the worker; the others attach to it, up to `peers`
stubs in the worker's life (it refuses more: the instances of a reload start a worker of their own beside the old
one, even after an old instance's stub died).

The worker leaves when every stub has said bye or its process has ended, however it went, or when tritonserver (the
first stub's parent) has ended. A stub whose process ends without its bye fails the other stubs' engine (`error`,
naming it). A worker that exits or is
killed shows as `error` (and `wait_steps` raising), which the poller turns into UNAVAILABLE for every open stream.
So does a hung worker: once ready it sends at least one message a second (engine_wire.HEARTBEAT_S); none for
`heartbeat_timeout_s` (the process is stopped, or wedged with the GIL held), or with requests in the engine no new
engine iteration for that long (the engine loop is stuck while the publisher still runs), is `error` too.
`wait_steps` judges this right after it has read every message waiting, so a stub that did not look for a while
is not misled by its own absence.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import zmq

from ..executor_interface import GenerationRequest, IterationStats, Step
from . import engine_worker
from .engine_wire import (
    CLIENT_ID_SHIFT,
    EngineSpec,
    Progress,
    WorkerInfo,
    decode,
    encode,
    encode_request,
    new_socket,
    unpack_steps,
)

READY_TIMEOUT_S = 900.0  # the first start dequantises SmolLM2 (tens of seconds on a small CPU)
JOIN_TIMEOUT_S = 10.0  # a running worker answers a hello at once
# A hello names when its stub stops waiting (CLOCK_MONOTONIC, the same in every process of the host); the worker
# ignores one it takes later than that, and the stub waits this much past it for an answer sent just in time.
ANSWER_GRACE_S = 5.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0  # config.pbtxt `engine_heartbeat_timeout_s`


class EngineProcess:
    """The worker seen from the stub; the same calls as `embedded.engine.Engine` (submit takes the request and its
    id, from `first_id` on). `submit`/`cancel` may come from any thread, `wait_steps` from one at a time. Within
    `submits_together`, the calling thread's submits go as one message when the block ends."""

    def __init__(self, spec: EngineSpec, shared_as: str | None = None, peers: int = 1,
                 ready_timeout_s: float = READY_TIMEOUT_S,
                 heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._dir = tempfile.mkdtemp(prefix="trtllm-stub-")  # this stub's event sockets
        self._context = zmq.Context()
        self._commands = new_socket(self._context, zmq.PUSH)
        self._events: zmq.Socket | None = None
        self._attempts = 0
        self._send_lock = threading.Lock()
        self._receive_lock = threading.Lock()
        self._stats: deque[IterationStats] = deque(maxlen=max(1, spec.stats_max_iterations))
        self._error: str | None = None
        self._left: int | None = None  # the worker's answer to this stub's bye: the stubs it has left
        self._stopped = False
        self._sent_submits = 0
        self._unsent: list[tuple[int, bytes]] = []  # submits held back (id, encoded request), under _send_lock
        self._holding: int | None = None  # the thread whose submits are held back (submits_together)
        self._queued_seen = (0, 0)  # (queued, submits the worker had seen) in its latest message
        self.process: subprocess.Popen | None = None  # the worker, when this stub started it
        self._worker_dir: str | None = None
        self._pidfd = -1
        self._registry: str | None = None
        self.info: WorkerInfo
        self.number: int  # this stub's number with the worker
        try:
            if shared_as is None:
                self._start(spec, 1, ready_timeout_s)
            else:
                with _rendezvous(f"{shared_as}\n{spec!r}") as registry:
                    self._registry = registry
                    if not self._join(registry, peers):
                        self._start(spec, peers, ready_timeout_s)
                        _write_json(registry, {"dir": self._worker_dir, "pid": self.pid})
        except BaseException:
            self.stop(timeout_s=5.0)
            raise
        self.first_id = self.number << CLIENT_ID_SHIFT
        self._heard_at = self._moved_at = time.monotonic()  # heartbeats count from here
        self._iteration = -1
        threading.Thread(target=self._watch_exit, name="engine-worker-exit", daemon=True).start()

    def _start(self, spec: EngineSpec, peers: int, timeout_s: float) -> None:
        """Start a worker and attach to it."""
        self._worker_dir = tempfile.mkdtemp(prefix="trtllm-engine-", dir=os.path.dirname(self._registry or "")
                                            or None)
        # The worker gets this interpreter's sys.path once it has started (not PYTHONPATH, which would also steer
        # the interpreter's own start-up imports): it imports what the stub imported, and not from its working
        # directory (which on the GPU host holds the stub's own numpy).
        path = [entry or os.getcwd() for entry in sys.path]
        bootstrap = (f"import sys; sys.path[:] = {path!r}; from {engine_worker.__name__} import main; "
                     f"main({[self._worker_dir]!r})")
        self.process = subprocess.Popen([_python(), "-c", bootstrap], stdin=subprocess.DEVNULL)
        self.pid = self.process.pid
        self._pidfd = os.pidfd_open(self.pid)
        self._commands.connect(f"ipc://{self._worker_dir}/commands")
        self._send(("spec", spec))
        reply = self._hello(peers, timeout_s)
        if reply is None or reply[0] != "ready":
            raise RuntimeError(f"engine worker failed to start: {reply[1]}" if reply else
                               f"engine worker not ready after {timeout_s:.0f} s")

    def _join(self, registry: str, peers: int) -> bool:
        """Attach to the worker the registry names, if it runs and takes one more stub."""
        try:
            with open(registry) as file:
                known = json.load(file)
            pid, directory = int(known["pid"]), str(known["dir"])
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                if directory.encode() not in file.read():  # the pid is another process's now
                    return False
            self._pidfd = os.pidfd_open(pid)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        address = f"ipc://{directory}/commands"
        self._commands.connect(address)
        self.pid = pid
        reply = self._hello(peers, JOIN_TIMEOUT_S)
        if reply is not None and reply[0] == "ready":
            return True
        self._commands.disconnect(address)
        os.close(self._pidfd)
        self._pidfd = -1
        return False

    def _hello(self, peers: int, timeout_s: float) -> tuple | None:
        """Say hello on a fresh event socket (a late answer to an earlier try cannot reach this one); the worker's
        answer, or None when it gave none in time or exited. A worker that takes the hello after `timeout_s` (busy, or
        stopped) ignores it, so a stub that gave up and started a worker of its own is not counted by this one."""
        if self._events is not None:
            self._events.close()
        self._attempts += 1
        self._events = new_socket(self._context, zmq.PULL)
        address = f"ipc://{self._dir}/events-{self._attempts}"
        self._events.bind(address)
        answer_by = time.monotonic() + timeout_s
        self._send(("hello", os.getpid(), address, peers, answer_by))
        while time.monotonic() < answer_by + ANSWER_GRACE_S:
            if self._events.poll(200):
                reply = decode(self._events.recv_multipart(copy=False))
                if reply[0] == "ready":
                    self.info, self.number = reply[1], reply[2]
                return reply
            if _ended(self._pidfd):
                if self.process is not None:
                    raise RuntimeError(f"engine worker exited while loading ({_exit_reason(self.process.wait())})")
                return None
        return None

    def _send(self, message: tuple) -> bool:
        """Send to the worker, after any submits held back (a cancel never overtakes its request's submit); False
        once `stop` has closed the socket (a late cancel from another thread)."""
        with self._send_lock:
            if self._commands.closed:
                return False
            self._send_unsent()
            self._commands.send_multipart(encode(message), copy=False)
            return True

    def _send_unsent(self) -> None:
        """(caller holds _send_lock)"""
        if not self._unsent:
            return
        unsent, self._unsent = self._unsent, []
        try:
            self._commands.send_multipart(encode(("submits", unsent)), copy=False)
        except zmq.ZMQError as exc:
            # These requests are the poller's already, and a held batch's enqueues have returned: the engine reports
            # dead instead (`error`), and the poller ends every open request with UNAVAILABLE. Nothing hangs.
            self._error = f"engine worker unreachable: {exc}"

    def submit(self, request_id: int, request: GenerationRequest) -> None:
        from ..embedded.engine import EngineDead

        if self.error:
            raise EngineDead(self.error)
        encoded = encode_request(request)
        with self._send_lock:
            if self._stopped or self._commands.closed:
                raise EngineDead("the engine is shut down")
            self._sent_submits += 1
            self._unsent.append((request_id, encoded))
            if self._holding != threading.get_ident():
                self._send_unsent()

    @contextmanager
    def submits_together(self) -> Iterator[None]:
        """Hold this thread's submits back until the block ends, then send them as one message: zmq lets go of the
        interpreter's lock for every send, and `execute()` waits to get it back beside the delivery threads
        (docs/performance.md, "Streaming through Triton on an H100"). Other threads' submits still go at once."""
        with self._send_lock:
            outer, self._holding = self._holding, threading.get_ident()
        try:
            yield
        finally:
            with self._send_lock:
                self._holding = outer
                if not self._commands.closed:
                    self._send_unsent()

    def cancel(self, request_id: int) -> None:
        if not self._stopped and self.error is None:
            self._send(("cancel", request_id))

    def wait_steps(self, timeout_s: float) -> list[Step]:
        """Steps of every message waiting, blocking up to `timeout_s` for the first; raises EngineDead once the
        worker has failed, exited or hung."""
        from ..embedded.engine import EngineDead

        steps: list[Step] = []
        if self._stopped:  # as the engine on a thread: nothing, after the timeout, no error
            # Not under the lock: a caller asking again at once would take it back each time, while `stop` waits
            # under it for the worker's answer to its bye.
            time.sleep(max(0.0, timeout_s))
            return steps
        with self._receive_lock:
            if self._stopped:  # `stop` took the lock first and closed the socket
                return steps
            timeout_ms = max(0, int(timeout_s * 1000))
            while self._events.poll(0 if steps else timeout_ms):
                self._take(decode(self._events.recv_multipart(copy=False)), steps)
            self._check_heartbeat()
        if not steps and self.error:
            raise EngineDead(self.error)
        return steps

    def _take(self, message: tuple, steps: list[Step]) -> None:
        """One message from the worker, whichever thread reads it (caller holds _receive_lock): a `wait_steps` that
        began before `stop` may read the answer to the bye."""
        kind = message[0]
        if kind == "steps":
            _, packed, stats, progress = message
            steps.extend(unpack_steps(packed))
            self._stats.extend(stats)
            self._heard(progress)
        elif kind == "dead":
            self._error = message[1]
        elif kind == "gone":
            self._left = message[1]

    def _heard(self, progress: Progress) -> None:
        now = time.monotonic()
        self._heard_at = now
        if not progress.busy or progress.iteration != self._iteration:
            self._moved_at = now
        self._iteration = progress.iteration
        self._queued_seen = (progress.queued, progress.submits_seen)

    def _check_heartbeat(self) -> None:
        if self._error is not None:
            return
        now, limit = time.monotonic(), self.heartbeat_timeout_s
        if now - self._heard_at > limit:
            self._error = (f"engine worker hung: no heartbeat for {now - self._heard_at:.1f} s "
                           f"(engine_heartbeat_timeout_s={limit:g})")
        elif now - self._moved_at > limit:
            self._error = (f"engine worker hung: no engine iteration for {now - self._moved_at:.1f} s with requests "
                           f"in flight (engine_heartbeat_timeout_s={limit:g})")

    def take_stats(self) -> list[IterationStats]:
        stats = []
        while self._stats:
            stats.append(self._stats.popleft())
        return stats

    def queued(self) -> int:
        queued, seen = self._queued_seen
        return queued + max(0, self._sent_submits - seen)

    def _watch_exit(self) -> None:
        """Wait for the worker to exit, on a thread of its own: `error` is then a plain read. (Asking the process on
        every enqueue and cancel was a waitpid call, which lets go of the interpreter's lock, twice a request.)"""
        if self.process is not None:
            reason = _exit_reason(self.process.wait())
        else:
            try:
                select.select([self._pidfd], [], [])
            except OSError:  # `stop` closed the pidfd: this stub has left
                return
            reason = "no exit status: another instance's stub started it"
        if self._error is None and not self._stopped:
            self._error = f"engine worker exited ({reason})"

    @property
    def error(self) -> str | None:
        return self._error

    def stop(self, timeout_s: float = 30.0) -> None:
        """Leave the worker; the last stub to leave waits for it to exit (a hung one is killed, for every stub)."""
        if self._stopped:
            return
        hung = self._error is not None and self._error.startswith("engine worker hung")
        self._stopped = True
        if self._pidfd >= 0 and not _ended(self._pidfd):
            left = None if hung else self._bye(timeout_s)
            if not left and not self._wait_exit(0 if hung else timeout_s):  # hung: it would not answer
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                self._wait_exit(timeout_s)
            if left == 0 and self._registry is not None:
                _forget(self._registry, self.pid)
        with self._receive_lock:
            if self._events is not None:
                self._events.close()
        with self._send_lock:
            self._commands.close()
        self._context.term()
        if self._pidfd >= 0:
            os.close(self._pidfd)
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._worker_dir is not None and (self.process is None or self.process.poll() is not None):
            shutil.rmtree(self._worker_dir, ignore_errors=True)  # the worker removes it, unless it was killed

    def _bye(self, timeout_s: float) -> int | None:
        """Say bye; the stubs the worker has left, or None when it did not answer in time."""
        if getattr(self, "number", None) is None or not self._send(("bye", self.number)):
            return None
        deadline = time.monotonic() + timeout_s
        with self._receive_lock:
            while self._left is None and self._events.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                self._take(decode(self._events.recv_multipart(copy=False)), [])
        return self._left

    def _wait_exit(self, timeout_s: float) -> bool:
        if self.process is not None:
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        return bool(select.select([self._pidfd], [], [], timeout_s)[0])


@contextmanager
def _rendezvous(key: str) -> Iterator[str]:
    """Hold the lock of `key`'s registry, the file that names its worker (pid and directory), and give its path. Both
    live in a directory only this user can enter: another user cannot name a worker, nor reach its sockets."""
    base = os.path.join(tempfile.gettempdir(), f"trtllm-engines-{os.getuid()}")
    os.makedirs(base, mode=0o700, exist_ok=True)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{base} is not a directory private to this user: engine workers are not shared there")
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    with _locked(os.path.join(base, f"{digest}.lock")):
        yield os.path.join(base, f"{digest}.worker")


@contextmanager
def _locked(path: str) -> Iterator[None]:
    with open(path, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # closing the file lets go
        yield


def _write_json(path: str, value: dict) -> None:
    with open(f"{path}.new", "w") as file:
        json.dump(value, file)
    os.replace(f"{path}.new", path)


def _forget(registry: str, pid: int) -> None:
    """Remove the registry once its worker has no stub left, unless it names a newer worker already."""
    with _locked(registry.removesuffix(".worker") + ".lock"):
        try:
            with open(registry) as file:
                if json.load(file).get("pid") == pid:
                    os.remove(registry)
        except (OSError, ValueError):
            pass


def _ended(pidfd: int) -> bool:
    return pidfd < 0 or bool(select.select([pidfd], [], [], 0)[0])


def _python() -> str:
    """This interpreter's executable; inside Triton's stub `sys.executable` may be the stub binary itself."""
    if os.path.basename(sys.executable).startswith("python"):
        return sys.executable
    candidate = os.path.join(sys.exec_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return candidate if os.access(candidate, os.X_OK) else shutil.which("python3") or "python3"


def _exit_reason(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        import signal

        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"
