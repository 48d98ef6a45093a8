"""The embedded engine in a worker process of its own, seen from the stub: `EngineProcess`, so that the engine's
steps do not share the stub's interpreter (and GIL) with the poller's sends (issue 24; TensorRT-LLM's LLM API and
vLLM's V1 run their engines the same way).

The stub keeps request checks, the tokenizer and everything Triton; the worker (engine_worker.py, in a fresh
interpreter with the stub's sys.path) loads the model from the same parameters, runs the `Engine` and compiles
guides. Transport: two pyzmq PUSH/PULL pairs over ipc:// sockets in a private temporary directory; the messages
are in engine_wire.py.

The worker exits when the stub's end of its stdin pipe closes, however the stub went (a pipe works whichever
thread started the worker; PR_SET_PDEATHSIG would fire when that thread ends). A worker that exits or is killed
shows as `error` (and `wait_steps` raising), which the poller turns into UNAVAILABLE for every open stream. So does
a hung worker: once ready it sends at least one message a second (engine_wire.HEARTBEAT_S); none for
`heartbeat_timeout_s` (the process is stopped, or wedged with the GIL held), or with requests in the engine no new
engine iteration for that long (the engine loop is stuck while the publisher still runs), is `error` too.
`wait_steps` judges this right after it has read every message waiting, so a stub that did not look for a while
is not misled by its own absence.
"""

from __future__ import annotations

import os
import shutil
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
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0  # config.pbtxt `engine_heartbeat_timeout_s`


class EngineProcess:
    """The worker seen from the stub; the same calls as `embedded.engine.Engine` (submit takes the request and its
    id). `submit`/`cancel` may come from any thread, `wait_steps` from one at a time. Within `submits_together`, the
    calling thread's submits go as one message when the block ends."""

    def __init__(self, spec: EngineSpec, ready_timeout_s: float = READY_TIMEOUT_S,
                 heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._dir = tempfile.mkdtemp(prefix="trtllm-engine-")
        self._context = zmq.Context()
        self._commands = new_socket(self._context, zmq.PUSH)
        self._events = new_socket(self._context, zmq.PULL)
        self._commands.bind(f"ipc://{self._dir}/commands")
        self._events.bind(f"ipc://{self._dir}/events")
        self._send_lock = threading.Lock()
        self._receive_lock = threading.Lock()
        self._stats: deque[IterationStats] = deque(maxlen=max(1, spec.stats_max_iterations))
        self._error: str | None = None
        self._stopped = False
        self._sent_submits = 0
        self._unsent: list[tuple[int, bytes]] = []  # submits held back (id, encoded request), under _send_lock
        self._holding: int | None = None  # the thread whose submits are held back (submits_together)
        self._queued_seen = (0, 0)  # (queued, submits the worker had seen) in its latest message
        # The worker gets this interpreter's sys.path once it has started (not PYTHONPATH, which would also steer
        # the interpreter's own start-up imports): it imports what the stub imported, and not from its working
        # directory (which on the GPU host holds the stub's own numpy).
        path = [entry or os.getcwd() for entry in sys.path]
        bootstrap = (f"import sys; sys.path[:] = {path!r}; from {engine_worker.__name__} import main; "
                     f"main({[self._dir]!r})")
        self.process = subprocess.Popen([_python(), "-c", bootstrap], stdin=subprocess.PIPE)
        try:
            self._send(("spec", spec))
            self.info = self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop(timeout_s=5.0)
            raise
        self._heard_at = self._moved_at = time.monotonic()  # heartbeats count from here
        self._iteration = -1
        threading.Thread(target=self._watch_exit, name="engine-worker-exit", daemon=True).start()

    def _wait_ready(self, timeout_s: float) -> WorkerInfo:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._events.poll(200):
                message = decode(self._events.recv_multipart(copy=False))
                if message[0] == "ready":
                    return message[1]
                raise RuntimeError(f"engine worker failed to start: {message[1]}")
            if self.process.poll() is not None:
                raise RuntimeError(f"engine worker exited while loading ({_exit_reason(self.process.returncode)})")
        raise RuntimeError(f"engine worker not ready after {timeout_s:.0f} s")

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
        with self._receive_lock:
            if self._stopped:  # as the engine on a thread: nothing, after the timeout, no error
                time.sleep(max(0.0, timeout_s))
                return steps
            timeout_ms = max(0, int(timeout_s * 1000))
            while self._events.poll(0 if steps else timeout_ms):
                message = decode(self._events.recv_multipart(copy=False))
                if message[0] == "steps":
                    _, packed, stats, progress = message
                    steps.extend(unpack_steps(packed))
                    self._stats.extend(stats)
                    self._heard(progress)
                elif message[0] == "dead":
                    self._error = message[1]
            self._check_heartbeat()
        if not steps and self.error:
            raise EngineDead(self.error)
        return steps

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
        returncode = self.process.wait()
        if self._error is None and not self._stopped:
            self._error = f"engine worker exited ({_exit_reason(returncode)})"

    @property
    def error(self) -> str | None:
        return self._error

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._stopped:
            return
        hung = self._error is not None and self._error.startswith("engine worker hung")
        self._stopped = True
        if self.process.poll() is None:
            try:
                if hung:  # it would not answer
                    raise subprocess.TimeoutExpired(self.process.args, 0)
                self._send(("stop",))
                self.process.wait(timeout_s)
            except (subprocess.TimeoutExpired, zmq.ZMQError):
                self.process.kill()
                self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()
        with self._receive_lock:
            self._events.close()
        with self._send_lock:
            self._commands.close()
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)


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
