"""The embedded engine in a worker process of its own, so that its steps do not share the stub's interpreter (and
GIL) with the poller's sends (issue 24; TensorRT-LLM's LLM API and vLLM's V1 run their engines the same way).

The stub keeps request checks, the tokenizer and everything Triton; the worker (`main`, in a fresh interpreter with
the stub's sys.path) loads the model from the same parameters and runs the `Engine`.
Transport: two pyzmq PUSH/PULL pairs over ipc:// sockets in a private temporary directory. A message is a pickle
(protocol 5) of plain tuples and dataclasses; numpy arrays (logits) travel as out-of-band frames, not copied into
the pickle.

  stub -> worker   ("spec", EngineSpec) once, then ("submit", id, GenerationRequest), ("cancel", id), ("stop",)
  worker -> stub   ("ready", WorkerInfo) or ("failed", message) once, then ("steps", steps, stats, queued,
                   submits seen): every step and iteration stat the engine published since the previous message,
                   one message per wake-up; ("dead", message) when the engine stops on a failure.

The worker exits when the stub's end of its stdin pipe closes, however the stub went (a pipe works whichever
thread started the worker; PR_SET_PDEATHSIG would fire when that thread ends). A worker that exits or is killed
shows as `error` (and `await_steps` raising), which the poller turns into UNAVAILABLE for every open stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass

import zmq

from ..executor_interface import FinishReason, GenerationRequest, IterationStats, Step

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 900.0  # the first start dequantises SmolLM2 (tens of seconds on a small CPU)


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


# -- message format -------------------------------------------------------------------------------------------------
class _Pickler(pickle.Pickler):
    """Steps and stats as the tuple of their fields (no field names: a 256-step message is a few kB)."""

    def reducer_override(self, obj):
        fields = _COMPACT.get(type(obj))
        if fields is None:
            return NotImplemented
        return type(obj), tuple(getattr(obj, name) for name in fields)


_COMPACT = {kind: tuple(field.name for field in dataclasses.fields(kind)) for kind in (Step, IterationStats)}


def encode(message: tuple) -> list:
    """Frames of one message: the pickle, then each out-of-band buffer (numpy arrays' data)."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(message)
    return [out.getbuffer(), *(buffer.raw() for buffer in buffers)]


def decode(frames: list) -> tuple:
    return pickle.loads(frames[0], buffers=frames[1:])


def _socket(context: zmq.Context, kind: int) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # never block a sender; both ends drain promptly
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock


# -- the stub's side ------------------------------------------------------------------------------------------------
class EngineProcess:
    """The worker seen from the stub; the same calls as `embedded.engine.Engine` (submit takes the request and its
    id). `submit`/`cancel` may come from any thread, `wait_steps` from one at a time."""

    def __init__(self, spec: EngineSpec, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self._dir = tempfile.mkdtemp(prefix="trtllm-engine-")
        self._context = zmq.Context()
        self._commands = _socket(self._context, zmq.PUSH)
        self._events = _socket(self._context, zmq.PULL)
        self._commands.bind(f"ipc://{self._dir}/commands")
        self._events.bind(f"ipc://{self._dir}/events")
        self._send_lock = threading.Lock()
        self._receive_lock = threading.Lock()
        self._stats: deque[IterationStats] = deque(maxlen=max(1, spec.stats_max_iterations))
        self._error: str | None = None
        self._stopped = False
        self._sent_submits = 0
        self._queued_seen = (0, 0)  # (queued, submits the worker had seen) in its latest message
        # The worker gets this interpreter's sys.path once it has started (not PYTHONPATH, which would also steer
        # the interpreter's own start-up imports): it imports what the stub imported, and not from its working
        # directory (which on the GPU host holds the stub's own numpy).
        path = [entry or os.getcwd() for entry in sys.path]
        bootstrap = f"import sys; sys.path[:] = {path!r}; from {__name__} import main; main({[self._dir]!r})"
        self.process = subprocess.Popen([_python(), "-c", bootstrap], stdin=subprocess.PIPE)
        try:
            self._send(("spec", spec))
            self.info = self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop(timeout_s=5.0)
            raise

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
        """Send to the worker; False once `stop` has closed the socket (a late cancel from another thread)."""
        with self._send_lock:
            if self._commands.closed:
                return False
            if message[0] == "submit":
                self._sent_submits += 1
            self._commands.send_multipart(encode(message), copy=False)
            return True

    def submit(self, request_id: int, request: GenerationRequest) -> None:
        from ..embedded.engine import EngineDead

        if self.error:
            raise EngineDead(self.error)
        if self._stopped:
            raise EngineDead("the engine is shut down")
        if not self._send(("submit", request_id, request)):
            raise EngineDead("the engine is shut down")

    def cancel(self, request_id: int) -> None:
        if not self._stopped and self.error is None:
            self._send(("cancel", request_id))

    def wait_steps(self, timeout_s: float) -> list[Step]:
        """Steps of every message waiting, blocking up to `timeout_s` for the first; raises EngineDead once the
        worker has failed or exited."""
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
                    _, new_steps, stats, queued, seen = message
                    steps.extend(new_steps)
                    self._stats.extend(stats)
                    self._queued_seen = (queued, seen)
                elif message[0] == "dead":
                    self._error = message[1]
        if not steps and self.error:
            raise EngineDead(self.error)
        return steps

    def take_stats(self) -> list[IterationStats]:
        stats = []
        while self._stats:
            stats.append(self._stats.popleft())
        return stats

    def queued(self) -> int:
        queued, seen = self._queued_seen
        return queued + max(0, self._sent_submits - seen)

    @property
    def error(self) -> str | None:
        if self._error is None and not self._stopped and self.process.poll() is not None:
            self._error = f"engine worker exited ({_exit_reason(self.process.returncode)})"
        return self._error

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            try:
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


# -- the worker's side ----------------------------------------------------------------------------------------------
class _Worker:
    def __init__(self, directory: str) -> None:
        self._context = zmq.Context()
        self._commands = _socket(self._context, zmq.PULL)
        self._events = _socket(self._context, zmq.PUSH)
        self._commands.connect(f"ipc://{directory}/commands")
        self._events.connect(f"ipc://{directory}/events")
        self._send_lock = threading.Lock()
        self._submits_seen = 0
        self._stopping = threading.Event()
        self._guides = None  # GuideCompiler, made on the first guided request
        self.engine = None

    def send(self, message: tuple) -> None:
        with self._send_lock:
            self._events.send_multipart(encode(message), copy=False)

    def receive(self) -> tuple:
        return decode(self._commands.recv_multipart(copy=False))

    def run(self) -> None:
        kind, spec = self.receive()
        assert kind == "spec", kind
        try:
            self.engine, info, self._tokenizer = build_engine(spec)
        except Exception as exc:  # noqa: BLE001 - the stub reports it as the load failure
            log.exception("engine worker failed to load")
            self.send(("failed", f"{type(exc).__name__}: {exc}"))
            return
        self.info = info
        self.send(("ready", info))
        publisher = threading.Thread(target=self._publish_steps, name="engine-steps", daemon=True)
        publisher.start()
        while True:
            message = self.receive()
            if message[0] == "submit":
                self._submit(message[1], message[2])
            elif message[0] == "cancel":
                self.engine.cancel(message[1])
            elif message[0] == "stop":
                break
        self._stopping.set()
        self.engine.stop()
        publisher.join(5.0)

    def _submit(self, request_id: int, request: GenerationRequest) -> None:
        from ..embedded.engine import EngineDead
        from ..embedded.sequence import Sequence

        self._submits_seen += 1
        try:
            sequence = Sequence.from_request(request_id, request, self.info.vocab_size, self.info.generation_eos_id)
            if request.guided_decoding_type is not None:
                sequence.guide = self._guide_matcher(request, sequence.end_id)
        except Exception as exc:  # noqa: BLE001 - this request's own failure: an error step, the engine goes on
            step = Step(request_id, is_final=True, finish_reason=FinishReason.ERROR,
                        error=f"request failed: {type(exc).__name__}: {exc}")
            self.send(("steps", [step], [], self.engine.queued(), self._submits_seen))
            return
        with contextlib.suppress(EngineDead):  # the publisher reports the engine's death
            self.engine.submit(sequence)

    def _guide_matcher(self, request: GenerationRequest, end_id: int | None) -> object:
        from ..embedded.guided import GuideCompiler

        if self._guides is None:
            end = self.info.generation_eos_id
            self._guides = GuideCompiler(self._tokenizer, self.info.vocab_size, [end] if end is not None else None)
        compiled = self._guides.compile(request.guided_decoding_type, request.guided_decoding_guide)
        return self._guides.matcher(compiled, end_id)

    def _publish_steps(self) -> None:
        from ..embedded.engine import EngineDead

        while True:
            try:
                steps = self.engine.wait_steps(1.0)
            except EngineDead as exc:
                self.send(("dead", str(exc)))
                return
            stats = self.engine.take_stats()
            if steps or stats:
                self.send(("steps", steps, stats, self.engine.queued(), self._submits_seen))
            elif self._stopping.is_set():
                return


def build_engine(spec: EngineSpec):
    """Load the model and start the engine as `spec` says; returns (engine, WorkerInfo, tokenizer)."""
    import torch

    from ..embedded.cpu_share import FreeCoreThreads
    from ..embedded.engine import Engine, EngineConfig
    from ..embedded.kv_budget import DEFAULT_FREE_GPU_MEM_FRACTION, KvBudget, default_kv_cache_bytes
    from ..embedded.model_loading import load_model
    from ..embedded.runner import ModelRunner

    loaded = load_model(model_dir=spec.model_dir, tokenizer_dir=spec.tokenizer_dir, device=spec.device,
                        dtype=spec.dtype, cache_dir=spec.cache_dir)
    if spec.torch_threads is not None:
        torch.set_num_threads(spec.torch_threads)
    elif spec.device == "cpu":
        FreeCoreThreads().start().attach(loaded.model)
    runner = ModelRunner(loaded.model, cuda_graphs=spec.cuda_graphs)
    memory = spec.kv_cache_memory_bytes
    if memory is None:
        fraction = spec.kv_cache_free_gpu_mem_fraction
        memory = default_kv_cache_bytes(runner.device, DEFAULT_FREE_GPU_MEM_FRACTION if fraction is None else fraction)
    budget = KvBudget(memory, runner.kv_bytes_per_token)
    engine = Engine(runner, EngineConfig(spec.max_batch_size, spec.max_num_tokens, budget, spec.stats_max_iterations,
                                         spec.enable_kv_cache_reuse))
    eos = getattr(getattr(loaded.model, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    info = WorkerInfo(runner.vocab_size, runner.max_positions, runner.kv_bytes_per_token, memory, eos,
                      loaded.source, os.getpid())
    return engine, info, loaded.tokenizer


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="engine worker %(process)d: %(levelname)s %(message)s")
    # The stub holds the write end of stdin; end of file means it is gone.
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), name="parent-watch", daemon=True).start()
    _Worker(argv[0]).run()
    logging.shutdown()
    os._exit(0)  # not a normal exit: the parent-watch thread is blocked reading stdin
