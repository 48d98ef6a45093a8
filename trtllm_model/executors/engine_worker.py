"""The engine worker process: loads the model as the stub's EngineSpec says, runs the `Engine`, and serves the stub's
commands (engine_wire.py has the messages; engine_client.py is the stub's side).

The engine's own thread sends its steps (with the iteration stats so far) as it makes them: a second thread waking
for them would take the interpreter's lock from the engine every iteration. Beside it: the command loop (submits,
cancels, stop; never waits on anything slow), the heartbeat (a message every HEARTBEAT_S with the engine's iteration
counter, and the engine's failure as soon as it fails), and the guide compiler's pool and deadline thread: a guided
request waits there, off the command loop, at most guide_compile_timeout_s for its guide (compiled once, here only;
the stub checks the guide's limits but does not compile it), then joins the engine or ends with an INVALID_ARG error
step. xgrammar releases the GIL while it compiles, so the other threads run meanwhile (they still share the CPU with
it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import zmq

from ..executor_interface import FinishReason, Step
from .engine_wire import (
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


class _Worker:
    def __init__(self, directory: str) -> None:
        self._context = zmq.Context()
        self._commands = new_socket(self._context, zmq.PULL)
        self._events = new_socket(self._context, zmq.PUSH)
        self._commands.connect(f"ipc://{directory}/commands")
        self._events.connect(f"ipc://{directory}/events")
        self._send_lock = threading.Lock()
        self._submits_seen = 0
        self._stopping = threading.Event()
        self._guides = None  # GuideCompiler, made on the first guided request
        # Guided requests whose guide is compiling, by id; the lock also orders their submit against a cancel.
        self._compiling: dict[int, Any] = {}
        self._admission_lock = threading.Lock()
        self.engine = None

    def send(self, message: tuple) -> None:
        with self._send_lock:
            self._events.send_multipart(encode(message), copy=False)

    def receive(self) -> tuple:
        return decode(self._commands.recv_multipart(copy=False))

    def run(self) -> None:
        kind, spec = self.receive()
        assert kind == "spec", kind
        self.spec = spec
        try:
            self.engine, info, self._tokenizer = build_engine(spec, self.send_steps)
        except Exception as exc:  # noqa: BLE001 - the stub reports it as the load failure
            log.exception("engine worker failed to load")
            self.send(("failed", f"{type(exc).__name__}: {exc}"))
            return
        self.info = info
        self.send(("ready", info))
        heartbeat = threading.Thread(target=self._send_heartbeats, name="engine-heartbeat", daemon=True)
        heartbeat.start()
        while self._handle(self.receive()):
            pass
        self._stopping.set()
        self.engine.stop()
        heartbeat.join(5.0)

    def send_steps(self, steps: list[Step]) -> None:
        """Steps (none: the heartbeat) with the iteration stats since the last message and the engine's progress;
        from the engine's thread, the heartbeat's and the command loop's."""
        engine = self.engine
        queued = engine.queued()
        work = queued > 0 or bool(engine.running) or bool(engine.scheduler.prefilling)
        # Before the first iteration the engine may still be capturing CUDA graphs: not judged as stalled then.
        progress = Progress(engine.iteration, work and engine.iteration > 0, queued + len(self._compiling),
                            self._submits_seen)
        self.send(("steps", pack_steps(steps), engine.take_stats(), progress))

    def _handle(self, command: tuple) -> bool:
        """Carry out one command as it arrives; False at a stop. Each request of a submits message reaches the engine
        as soon as it is decoded, so it can prefill a burst's first requests while the rest arrive. Taking the queued
        commands of a burst together (569745b, reverted) gave 0.88-0.90x the tokens/s at 256 streams on an H200
        (docs/performance.md, "The embedded engine on an H200 today")."""
        if command[0] == "submits":
            for request_id, encoded in command[1]:
                self._submit(request_id, encoded)
        elif command[0] == "cancel":
            self._cancel(command[1])
        elif command[0] == "stop":
            return False
        return True

    def _submit(self, request_id: int, encoded: bytes) -> None:
        from ..embedded.sequence import Sequence

        self._submits_seen += 1
        try:
            request = decode_request(encoded)
            sequence = Sequence.from_request(request_id, request, self.info.vocab_size, self.info.generation_eos_id)
            if request.guided_decoding_type is not None:
                with self._admission_lock:
                    self._compiling[request_id] = sequence
                self._guide_compiler().when_compiled(
                    request.guided_decoding_type, request.guided_decoding_guide,
                    lambda outcome: self._guide_compiled(sequence, request.guided_decoding_type, outcome))
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
        with self._admission_lock:
            compiling = self._compiling.pop(request_id, None) is not None
            if not compiling:
                self.engine.cancel(request_id)
        if compiling:  # the engine never saw it; its guide goes on compiling for the cache
            self.send_steps([Step(request_id, is_final=True, finish_reason=FinishReason.CANCELLED)])

    def _guide_compiler(self) -> Any:
        from ..embedded.guided import GuideCompiler

        if self._guides is None:
            end = self.info.generation_eos_id
            self._guides = GuideCompiler(self._tokenizer, self.info.vocab_size, [end] if end is not None else None,
                                         timeout_s=self.spec.guide_compile_timeout_s)
        return self._guides

    def _guide_compiled(self, sequence: Any, guide_type: str, outcome: Any) -> None:
        """The guide compiled, failed or ran out of time (on the compiler's threads): start or refuse the request."""
        from ..embedded.guided import GuideError, refusal_message

        request_id = sequence.request_id
        try:
            if isinstance(outcome, GuideError):
                raise outcome
            sequence.guide = self._guides.matcher(outcome, sequence.end_id)
        except GuideError as exc:
            with self._admission_lock:
                if self._compiling.pop(request_id, None) is not None:
                    self._fail(request_id, refusal_message(guide_type, exc), client_error=True)
            return
        except Exception as exc:  # noqa: BLE001 - this request's own failure
            with self._admission_lock:
                if self._compiling.pop(request_id, None) is not None:
                    self._fail(request_id, f"request failed: {type(exc).__name__}: {exc}")
            return
        with self._admission_lock:  # a cancel either took it out already or reaches the engine after this submit
            if self._compiling.pop(request_id, None) is not None:
                self._start(sequence)

    def _send_heartbeats(self) -> None:
        from ..embedded.engine import EngineDead

        while True:
            try:
                self.engine.wait_steps(HEARTBEAT_S)  # none (the engine sends its own): returns early if it fails
            except EngineDead as exc:
                self.send(("dead", str(exc)))
                return
            if self._stopping.is_set():
                return
            self.send_steps([])


def build_engine(spec: EngineSpec, send_steps: Callable[[list[Step]], None]):
    """Load the model and start the engine as `spec` says, sending its steps through `send_steps`; returns (engine,
    WorkerInfo, tokenizer)."""
    import torch

    from ..embedded.cpu_share import FreeCoreThreads
    from ..embedded.engine import Engine, EngineConfig, default_decode_steps
    from ..embedded.kv_budget import DEFAULT_FREE_GPU_MEM_FRACTION, KvBudget, default_kv_cache_bytes
    from ..embedded.model_loading import load_model
    from ..embedded.runner import ModelRunner

    loaded = load_model(model_dir=spec.model_dir, tokenizer_dir=spec.tokenizer_dir, device=spec.device,
                        dtype=spec.dtype, cache_dir=spec.cache_dir)
    if spec.torch_threads is not None:
        torch.set_num_threads(spec.torch_threads)
    elif spec.device == "cpu":
        FreeCoreThreads().start().attach(loaded.model)
    runner = ModelRunner(loaded.model, cuda_graphs=spec.cuda_graphs, fused_forwards=spec.fused_forward)
    memory = spec.kv_cache_memory_bytes
    if memory is None:
        fraction = spec.kv_cache_free_gpu_mem_fraction
        memory = default_kv_cache_bytes(runner.device, DEFAULT_FREE_GPU_MEM_FRACTION if fraction is None else fraction)
    budget = KvBudget(memory, runner.kv_bytes_per_token)
    overlap = runner.device.type == "cuda" if spec.overlap_steps is None else spec.overlap_steps
    engine = Engine(runner, EngineConfig(spec.max_batch_size, spec.max_num_tokens, budget, spec.stats_max_iterations,
                                         spec.enable_kv_cache_reuse, spec.prefill_stall_factor, overlap,
                                         default_decode_steps(runner.device, spec.decode_steps)), send_steps)
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
    logging.basicConfig(level=logging.INFO, format="engine worker %(process)d: %(levelname)s %(message)s")
    # The stub holds the write end of stdin; end of file means it is gone.
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), name="parent-watch", daemon=True).start()
    _Worker(argv[0]).run()
    logging.shutdown()
    os._exit(0)  # not a normal exit: the parent-watch thread is blocked reading stdin
