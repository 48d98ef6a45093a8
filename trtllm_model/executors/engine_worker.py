"""The engine worker process: loads the model as the first stub's EngineSpec says, runs the `Engine`, and serves the
commands of every stub attached to it (engine_wire.py has the messages; engine_client.py is the stubs' side).

The engine's own thread sends its steps (with the iteration stats so far) as it makes them, each stub its own: a
second thread waking for them would take the interpreter's lock from the engine every iteration. Beside it: the
command loop (submits, cancels, stubs coming and going; never waits on anything slow), the heartbeat (a message
every HEARTBEAT_S with the engine's iteration counter, and the engine's failure as soon as it fails), the watch on the
stubs' processes (one that ends leaves, its requests cancelled; one that ended without a bye fails the other stubs'
engine, since Triton never answers the requests of a lost stub; the worker stops when none is left, however they
went, and at once when the stubs' server ends), and the guide compiler's pool and deadline thread: a guided request waits there, off the command loop, at
most guide_compile_timeout_s for its guide (compiled once, here only; the stub checks the guide's limits but does not
compile it), then joins the engine or ends with an error step (INVALID_ARG; UNAVAILABLE while the compiler is busy). xgrammar releases the GIL while it
compiles, so the other threads run meanwhile (they still share the CPU with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from ..executor_interface import FinishReason, Step
from ..process_watch import exit_when_ended, parent_of
from .engine_wire import (
    CLIENT_ID_SHIFT,
    HEARTBEAT_S,
    EngineSpec,
    Progress,
    WorkerInfo,
    decode,
    decode_request,
    encode,
    new_socket,
    pack_steps,
)

log = logging.getLogger(__name__)

WATCH_S = 0.2  # how often the stubs' processes are looked at
START_TIMEOUT_S = 60.0


@dataclass(slots=True, eq=False)
class _Stub:
    """An attached stub: where its steps go, its process (a pidfd) and its requests still open."""

    number: int
    events: zmq.Socket
    pidfd: int
    submits_seen: int = 0
    open: set[int] = field(default_factory=set)


class _Worker:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._context = zmq.Context()
        self._commands = new_socket(self._context, zmq.PULL)
        self._commands.bind(f"ipc://{directory}/commands")
        # Guards the stubs and their sockets: the engine's thread, the heartbeat, the command loop and the guide
        # compiler's threads all send.
        self._send_lock = threading.Lock()
        self._stubs: dict[int, _Stub] = {}
        self._numbers = 0
        self._stopping = threading.Event()
        self._guides = None  # GuideCompiler, made on the first guided request
        self._guided = None  # GuidedStarts: guided requests waiting for their guide, made with the compiler
        self.engine = None

    def receive(self, timeout_s: float | None = None) -> tuple:
        if timeout_s is not None and not self._commands.poll(int(timeout_s * 1000)):
            raise TimeoutError("no command")
        return decode(self._commands.recv_multipart(copy=False))

    def run(self) -> None:
        # The starting stub sends these at once; a worker whose stub died before that does not wait for ever.
        kind, spec = self.receive(START_TIMEOUT_S)
        assert kind == "spec", kind
        self.spec = spec
        hello = self.receive(START_TIMEOUT_S)
        assert hello[0] == "hello", hello[0]
        first = self._attach(*hello[1:4])  # the starting stub waits out the load (READY_TIMEOUT_S)
        try:
            self.engine, info, self._tokenizer = build_engine(spec, self.send_steps)
        except Exception as exc:  # noqa: BLE001 - the stub reports it as the load failure
            log.exception("engine worker failed to load")
            first.events.send_multipart(encode(("failed", f"{type(exc).__name__}: {exc}")), copy=False)
            return
        self.info = info
        self._send_to(first, ("ready", info, first.number))
        heartbeat = threading.Thread(target=self._send_heartbeats, name="engine-heartbeat", daemon=True)
        heartbeat.start()
        threading.Thread(target=self._watch_stubs, name="stub-watch", daemon=True).start()
        while self._handle(self.receive()):
            pass
        self._stopping.set()
        self.engine.stop()
        heartbeat.join(5.0)

    def _attach(self, pid: int, address: str, capacity: int) -> _Stub:
        """A stub that said hello (on the command loop): its number and its event socket."""
        if not self._stubs and not self._numbers:
            self._end_with_server(pid)
        events = new_socket(self._context, zmq.PUSH)
        events.connect(address)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # it is gone already: watched as gone
            pidfd = -1
        with self._send_lock:
            self._numbers += 1
            stub = self._stubs[self._numbers] = _Stub(self._numbers, events, pidfd)
        log.info("stub %d (pid %d) attached; %d of %d", stub.number, pid, len(self._stubs), capacity)
        return stub

    def _end_with_server(self, stub_pid: int) -> None:
        """The worker never outlives the server its stubs belong to (the first stub's parent: tritonserver), whatever
        its stubs do: a stub left behind by a stop that ran out of time would otherwise keep it decoding for hours."""
        server = parent_of(stub_pid)
        if server is not None and server > 1:
            exit_when_ended(server, "the stubs' server", lambda: shutil.rmtree(self.directory, ignore_errors=True))

    def _detach(self, number: int, answer: bool) -> int:
        """The stub leaves (a bye, answered; or its process ended): its open requests are cancelled; the stubs
        left."""
        with self._send_lock:
            stub = self._stubs.pop(number, None)
            left = len(self._stubs)
        if stub is None:
            return left
        for request_id in list(stub.open):
            self._cancel(request_id)
        if answer:
            stub.events.send_multipart(encode(("gone", left)), copy=False)
        stub.events.close(linger=1000 if answer else 0)
        if stub.pidfd >= 0:
            os.close(stub.pidfd)
        log.info("stub %d left; %d attached", number, left)
        return left

    def _send_to(self, stub: _Stub, message: tuple) -> None:
        with self._send_lock:
            stub.events.send_multipart(encode(message), copy=False)

    def _send_all(self, message: tuple) -> None:
        with self._send_lock:
            for stub in self._stubs.values():
                stub.events.send_multipart(encode(message), copy=False)

    def send_steps(self, steps: list[Step]) -> None:
        """Each stub its steps (none: the heartbeat), the iteration stats since the last message (to the first stub)
        and the engine's progress; from the engine's thread, the heartbeat's, the command loop's and the guide
        compiler's."""
        engine = self.engine
        queued = engine.queued()
        work = queued > 0 or bool(engine.running) or bool(engine.scheduler.prefilling)
        # Before the first iteration the engine may still be capturing CUDA graphs: not judged as stalled then.
        busy, iteration, waiting = work and engine.iteration > 0, engine.iteration, queued + (
            self._guided.waiting if self._guided is not None else 0)
        with self._send_lock:
            stubs = self._stubs
            if not stubs:
                return
            if self._numbers == 1:  # the one stub there ever was: every step is its own
                parts = {1: steps}
            else:
                parts = {number: [] for number in stubs}
                for step in steps:
                    part = parts.get(step.request_id >> CLIENT_ID_SHIFT)
                    if part is not None:  # else its stub has left
                        part.append(step)
            stats = engine.take_stats()
            for stub in stubs.values():
                own = parts[stub.number]
                for step in own:
                    if step.is_final:
                        stub.open.discard(step.request_id)
                progress = Progress(iteration, busy, waiting, stub.submits_seen)
                stub.events.send_multipart(encode(("steps", pack_steps(own), stats, progress)), copy=False)
                stats = []

    def _handle(self, command: tuple) -> bool:
        """Carry out one command as it arrives; False once no stub is left. Each request of a submits message reaches
        the engine as soon as it is decoded, so it can prefill a burst's first requests while the rest arrive.
        Taking the queued commands of a burst together (569745b, reverted) gave 0.88-0.90x the tokens/s at 256
        streams on an H200 (docs/performance.md, "The embedded engine on an H200 today")."""
        kind = command[0]
        if kind == "submits":
            for request_id, encoded in command[1]:
                self._submit(request_id, encoded)
        elif kind == "cancel":
            self._cancel(command[1])
        elif kind == "hello":
            self._hello(*command[1:])
        elif kind in ("bye", "left"):
            return self._detach(command[1], answer=kind == "bye") > 0
        return True

    def _hello(self, pid: int, address: str, capacity: int, answer_by: float) -> None:
        late = time.monotonic() - answer_by
        if late > 0:  # that stub no longer waits for an answer (engine_client.ANSWER_GRACE_S)
            log.warning("a hello from pid %d taken %.1f s after its stub gave up: ignored", pid, late)
            return
        # Up to `capacity` stubs in the worker's life: a reload's stubs, arriving while the old ones still serve (or
        # after one of them died: Triton 2.51 does not restart a stub), get a worker of their own.
        if self._numbers >= capacity:
            refused = new_socket(self._context, zmq.PUSH)
            refused.connect(address)
            refused.send_multipart(encode(("full",)), copy=False)
            refused.close(linger=1000)
            return
        stub = self._attach(pid, address, capacity)
        self._send_to(stub, ("ready", self.info, stub.number))

    def _watch_stubs(self) -> None:
        """A stub whose process ended leaves through the command loop, as a bye does (its events socket stays open,
        unanswered); the loop ends when the last one goes. One that ended still attached (no bye: killed, crashed)
        fails the others' engine first (`_peer_lost`)."""
        tell = new_socket(self._context, zmq.PUSH)
        tell.connect(f"ipc://{self.directory}/commands")
        while not self._stopping.is_set():
            with self._send_lock:
                watched = {stub.pidfd: stub for stub in self._stubs.values()}
            gone = [stub for fd, stub in watched.items() if fd < 0]
            try:
                ready, _, _ = select.select([fd for fd in watched if fd >= 0], [], [], WATCH_S)
            except OSError:  # a pidfd closed by a bye meanwhile: look again
                continue
            for stub in gone + [watched[fd] for fd in ready]:
                with self._send_lock:
                    attached = self._stubs.get(stub.number) is stub
                if not attached:  # it said bye meanwhile (a stub exits once its bye is answered)
                    continue
                log.info("stub %d ended: leaving", stub.number)
                self._peer_lost(stub.number)
                tell.send_multipart(encode(("left", stub.number)), copy=False)
            if gone or ready:
                self._stopping.wait(WATCH_S)  # the command loop takes it out meanwhile
        tell.close()

    def _peer_lost(self, number: int) -> None:
        """A stub ended without saying bye (killed, crashed): the other stubs' model cannot go on. Triton 2.51 never
        answers that instance's open requests nor restarts its stub, and keeps handing it requests that fail; the
        others hear it as the engine's failure, end their streams and report the model not ready (it unloads itself)
        until it is loaded again."""
        with self._send_lock:
            others = [stub for stub in self._stubs.values() if stub.number != number]
            for stub in others:
                stub.events.send_multipart(encode(("dead", f"instance stub {number} of this engine ended without "
                                                           "leaving (killed or crashed); reload the model")), copy=False)

    def _submit(self, request_id: int, encoded: bytes) -> None:
        from ..embedded.sequence import Sequence

        stub = self._stubs.get(request_id >> CLIENT_ID_SHIFT)
        if stub is None:  # its stub left after sending it
            return
        stub.submits_seen += 1
        stub.open.add(request_id)
        try:
            request = decode_request(encoded)
            sequence = Sequence.from_request(request_id, request, self.info.vocab_size, self.info.generation_eos_id)
            if request.guided_decoding_type is not None:
                self._guide_compiler()
                self._guided.admit(sequence, request.guided_decoding_type, request.guided_decoding_guide)
                return
        except Exception as exc:  # noqa: BLE001 - this request's own failure: an error step, the engine goes on
            self._fail(request_id, f"request failed: {type(exc).__name__}: {exc}")
            return
        self._start(sequence)

    def _start(self, sequence: Any) -> None:
        from ..embedded.engine import EngineDead

        with contextlib.suppress(EngineDead):  # the publisher reports the engine's death
            self.engine.submit(sequence)

    def _fail(self, request_id: int, error: str, client_error: bool = False) -> None:
        self.send_steps([Step(request_id, is_final=True, finish_reason=FinishReason.ERROR, error=error,
                              client_error=client_error)])

    def _cancel(self, request_id: int) -> None:
        if self._guided is None or not self._guided.cancel(request_id):  # not waiting for its guide: the engine's
            self.engine.cancel(request_id)

    def _guide_compiler(self) -> Any:
        from ..embedded.guided import GuideCompiler, GuidedStarts

        if self._guides is None:
            end = self.info.generation_eos_id
            self._guides = GuideCompiler(self._tokenizer, self.info.vocab_size, [end] if end is not None else None,
                                         timeout_s=self.spec.guide_compile_timeout_s,
                                         max_cache_bytes=self.spec.max_guide_cache_bytes)
            self._guided = GuidedStarts(lambda: self._guides, self._start, self.send_steps)
        return self._guides

    def _send_heartbeats(self) -> None:
        from ..embedded.engine import EngineDead

        while True:
            try:
                self.engine.wait_steps(HEARTBEAT_S)  # none (the engine sends its own): returns early if it fails
            except EngineDead as exc:
                self._send_all(("dead", str(exc)))
                return
            if self._stopping.is_set():
                return
            self.send_steps([])


def build_engine(spec: EngineSpec, send_steps: Callable[[list[Step]], None]):
    """Load the model and start the engine as `spec` says, sending its steps through `send_steps`; returns (engine,
    WorkerInfo, tokenizer)."""
    import torch

    from ..embedded.cpu_share import FreeCoreThreads
    from ..embedded.engine import GRAPH_PREFILL_ROWS, Engine, EngineConfig, default_decode_steps
    from ..embedded.kv_budget import DEFAULT_FREE_GPU_MEM_FRACTION, KvBudget, default_kv_cache_bytes
    from ..embedded.model_loading import load_model
    from ..embedded.runner import ModelRunner

    loaded = load_model(model_dir=spec.model_dir, tokenizer_dir=spec.tokenizer_dir, device=spec.device,
                        dtype=spec.dtype, cache_dir=spec.cache_dir)
    if spec.torch_threads is not None:
        torch.set_num_threads(spec.torch_threads)
    elif spec.device == "cpu":
        FreeCoreThreads().start().attach(loaded.model)
    runner = ModelRunner(loaded.model, cuda_graphs=spec.cuda_graphs, fused_forwards=spec.fused_forward,
                         deterministic=spec.deterministic)
    overlap = runner.device.type == "cuda" if spec.overlap_steps is None else spec.overlap_steps
    decode_steps = default_decode_steps(runner.device, spec.decode_steps)
    memory = spec.kv_cache_memory_bytes
    if memory is None:
        fraction = spec.kv_cache_free_gpu_mem_fraction
        memory = default_kv_cache_bytes(runner, spec.max_batch_size, spec.max_num_tokens,
                                        spec.max_batch_size + GRAPH_PREFILL_ROWS, decode_steps if overlap else 1,
                                        DEFAULT_FREE_GPU_MEM_FRACTION if fraction is None else fraction)
    budget = KvBudget(memory, runner.kv_bytes_per_token)
    engine = Engine(runner, EngineConfig(spec.max_batch_size, spec.max_num_tokens, budget, spec.stats_max_iterations,
                                         spec.enable_kv_cache_reuse, spec.prefill_stall_factor, overlap, decode_steps),
                    send_steps)
    engine.wait_warm()  # "ready" goes to the stub after the warm-up, so the model is READY only then
    eos = getattr(getattr(loaded.model, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    info = WorkerInfo(runner.vocab_size, runner.max_positions, runner.kv_bytes_per_token, memory, eos,
                      loaded.source, os.getpid())
    return engine, info, loaded.tokenizer


def main(argv: list[str]) -> None:
    """Serve in `argv[0]`, a directory of the stub that started it, removed when the worker ends."""
    logging.basicConfig(level=logging.INFO, format="engine worker %(process)d: %(levelname)s %(message)s")
    code = 0
    try:
        _Worker(argv[0]).run()
    except BaseException:
        log.exception("engine worker failed")
        code = 1
    finally:
        shutil.rmtree(argv[0], ignore_errors=True)
        logging.shutdown()
        os._exit(code)  # not a normal exit: daemon threads may be inside the engine or a socket
