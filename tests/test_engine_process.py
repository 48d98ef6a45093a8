"""The embedded engine in a worker process (executors/engine_client.py, engine_worker.py): the message format
(engine_wire.py), and everything the
executor interface promises across the process boundary (ids, tokens, logits, cancellation, stats, rejections,
death of the worker, the worker dying with its parent). One worker (SmolLM2) serves the module's tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zmq
from engine_helpers import run_all

from trtllm_model.embedded.cpu_share import FreeCoreThreads, busy_jiffies, threads_for
from trtllm_model.executor_interface import (
    ExecutorError,
    FinishReason,
    GenerationRequest,
    IterationStats,
    KvCacheStats,
    QueueFull,
    RequestRejected,
    Step,
)
from trtllm_model.executors import engine_client, engine_worker
from trtllm_model.executors.engine_client import EngineProcess
from trtllm_model.executors.engine_wire import (
    CLIENT_ID_SHIFT,
    Progress,
    decode,
    decode_request,
    encode,
    encode_request,
    new_socket,
    pack_steps,
    unpack_steps,
)
from trtllm_model.executors.transformers_executor import PARAMETERS, TransformersExecutor, create
from trtllm_model.params import Params

PROMPT = "What is the capital of France?"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def new_process_executor(**parameters: str) -> TransformersExecutor:
    raw = {"engine_process": "true", "max_batch_size": "4", "max_num_tokens": "256", **parameters}
    executor = create(Params(raw, PARAMETERS))
    assert isinstance(executor.engine, EngineProcess)
    return executor


@pytest.fixture(scope="module")
def executor():
    # float32: the logits are compared with a thread engine's (load_model's float32) to 1e-3
    executor = new_process_executor(max_queue_size="2", dtype="float32")
    yield executor
    executor.shutdown()


@pytest.fixture(scope="module")
def prompt(executor):
    tokenizer = executor.tokenizer()
    messages = [{"role": "user", "content": PROMPT}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def run(executor, request_id: int, timeout_s: float = 120.0) -> list[Step]:
    steps, deadline = [], time.monotonic() + timeout_s
    while not any(step.is_final for step in steps):
        assert time.monotonic() < deadline, "no final step"
        steps += [step for step in executor.await_steps(1.0) if step.request_id == request_id]
    return steps


# -- the message format ---------------------------------------------------------------------------------------------
def test_a_steps_message_round_trips_with_logits_as_out_of_band_frames():
    logits = np.random.default_rng(1).standard_normal((1, 3, 49152), dtype=np.float32)
    steps = [
        Step(7, [11, 12, 13], log_probs=[-0.5, -1.0, -0.25], cum_log_prob=-1.75, generation_logits=logits),
        Step(8, is_final=True, finish_reason=FinishReason.ERROR, error="decode failed: boom", client_error=True),
        Step(9, [5], is_final=True, finish_reason=FinishReason.LENGTH, cum_log_prob=-0.1, kv_cache_reused_blocks=2),
        Step(10, [], is_final=True, finish_reason=FinishReason.CANCELLED, log_probs=[], cum_log_prob=-2.0),
    ]
    stats = [IterationStats(1.5, 3, 2, 0, 4, kv_cache=KvCacheStats(100, 60, 40, 1))]
    frames = encode(("steps", pack_steps(steps), stats, Progress(3, True, 0, 2)))
    assert len(frames) == 2 and len(frames[0]) < 2000  # the logits beside the pickle, not in it
    kind, packed, got_stats, progress = decode(frames)
    assert kind == "steps" and progress == Progress(3, True, 0, 2) and got_stats == stats
    got = unpack_steps(packed)
    assert np.array_equal(got[0].generation_logits, logits) and got[0].generation_logits.dtype == np.float32
    got[0].generation_logits = steps[0].generation_logits = None
    assert got == steps


def test_submitted_requests_round_trip_with_every_field_and_their_arrays_in_one_frame():
    lora = np.arange(30 * 4096, dtype=np.float32).reshape(30, 4096)
    request = GenerationRequest(
        input_ids=[1, 2, 3], max_tokens=9, end_id=2, temperature=0.7, top_k=5, seed=11, min_tokens=3,
        stop_words=[[4, 5]], bad_words=[[6]], embedding_bias=[0.5, -1.0], return_log_probs=True,
        allotted_time_ms=250, lora_task_id=3, lora_weights=lora, lora_config=np.ones((30, 3), dtype=np.int32),
        guided_decoding_type="regex", guided_decoding_guide="[ab]+", cache_salt="tenant",
        lora_adapter=(1, "a", "/loras/a", "hf"), faults={"x": "y"})
    plain = GenerationRequest(input_ids=[4], max_tokens=1)
    frames = encode(("submits", [(7, encode_request(request)), (8, encode_request(plain))]))
    assert len(frames) == 1  # one frame, the arrays inside: pyzmq lets go of the interpreter's lock once a frame
    kind, submits = decode(frames)
    assert kind == "submits" and [request_id for request_id, _ in submits] == [7, 8]
    assert decode_request(submits[1][1]) == plain
    got = decode_request(submits[0][1])
    assert np.array_equal(got.lora_weights, lora)
    assert np.array_equal(got.lora_config, request.lora_config) and got.lora_config.dtype == np.int32
    got.lora_weights = request.lora_weights = got.lora_config = request.lora_config = None
    assert got == request


class RecordingEngine:
    """What the worker hands the engine: each submit's request id, each cancel."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def submit(self, sequence) -> None:
        self.calls.append(("submit", sequence.request_id))

    def cancel(self, request_id: int) -> None:
        self.calls.append(("cancel", request_id))


def worker_beside(tmp_path) -> tuple[engine_worker._Worker, zmq.Socket, int]:
    """A worker's command handling over its real socket (a stub's end connected here, attached as stub 1), with a
    recording engine; the stub's first request id."""
    worker = engine_worker._Worker(str(tmp_path))
    commands = new_socket(zmq.Context.instance(), zmq.PUSH)
    commands.connect(f"ipc://{tmp_path}/commands")
    worker.engine = RecordingEngine()
    worker.info = SimpleNamespace(vocab_size=100, generation_eos_id=2)
    stub = worker._attach(os.getpid(), f"ipc://{tmp_path}/events", 1)
    return worker, commands, stub.number << CLIENT_ID_SHIFT


def test_each_command_reaches_the_engine_as_it_arrives_and_a_request_that_cannot_start_fails_alone(tmp_path):
    """Submits and cancels reach the engine one by one in the order sent (a submit is not held back for the ones
    behind it, in its message or after it); a request the worker cannot decode or make a sequence of gets its own
    error step and the rest go on; the last stub's bye ends the loop."""
    worker, commands, base = worker_beside(tmp_path)
    events = new_socket(zmq.Context.instance(), zmq.PULL)
    events.bind(f"ipc://{tmp_path}/events")
    request = encode_request(GenerationRequest(input_ids=[5, 6, 7], max_tokens=4))
    sent = [encode(("submits", [(base + 1, request), (base + 2, request)])), encode(("cancel", base + 1)),
            encode(("submits", [(base + 3, request), (base + 4, encode_request(None)), (base + 5, b"not a pickle"),
                                (base + 6, request)])),
            encode(("bye", 1))]
    for frames in sent:
        commands.send_multipart(frames)
    failed, handled = [], []
    worker.send_steps = failed.extend
    submit = worker._submit

    def submit_seen(request_id: int, encoded: bytes) -> None:
        if request_id == base + 2:
            assert worker.engine.calls == [("submit", base + 1)]  # with the engine before the next is decoded
        submit(request_id, encoded)

    worker._submit = submit_seen
    stub = worker._stubs[1]
    for _ in sent[:-1]:
        handled.append(worker._handle(worker.receive()))
    assert stub.submits_seen == 6 and stub.open == {base + n for n in range(1, 7)}
    handled.append(worker._handle(worker.receive()))
    assert handled == [True] * 3 + [False]
    # the bye cancels what its stub left open (here every request: the recording engine ends none)
    calls = worker.engine.calls
    assert calls[:5] == [("submit", base + 1), ("submit", base + 2), ("cancel", base + 1), ("submit", base + 3),
                         ("submit", base + 6)]
    assert sorted(calls[5:]) == [("cancel", base + n) for n in range(1, 7)]
    assert [(step.request_id, step.finish_reason) for step in failed] == [(base + 4, FinishReason.ERROR),
                                                                          (base + 5, FinishReason.ERROR)]
    assert events.poll(1000) and decode(events.recv_multipart()) == ("gone", 0)
    events.close()
    commands.close()
    worker._commands.close()
    worker._context.term()


def test_a_step_batch_is_a_few_columns_whatever_the_number_of_requests():
    """256 decoding requests: one list per column, the rare fields (one error) in the side list; every field
    comes back, log probs only where they were sent."""
    steps = [Step(i, [i % 7, i], log_probs=[-0.5, -float(i)] if i % 2 else None, cum_log_prob=-float(i) if i % 2
                  else None) for i in range(256)]
    steps[100] = Step(100, is_final=True, finish_reason=FinishReason.ERROR, error="request failed: no")
    steps[200].top_log_probs = [[(200, -0.1), (3, -2.5)], [(7, -0.2), (200, -1.0)]]  # top_logprobs asked
    packed = pack_steps(steps)
    assert packed.token_ids == [step.token_ids for step in steps] and packed.request_ids == list(range(256))
    assert [index for index, _ in packed.extras] == [100, 200]
    assert unpack_steps(decode(encode(("steps", packed)))[1]) == steps
    plain = [Step(i, [i]) for i in range(3)]
    assert pack_steps(plain).log_probs is None and pack_steps(plain).cum_log_probs is None
    assert unpack_steps(decode(encode(("steps", pack_steps(plain))))[1]) == plain
    assert unpack_steps(pack_steps([])) == []


# -- point 3: threads for the free cores ----------------------------------------------------------------------------
def test_busy_jiffies_counts_only_the_given_cpus_without_idle_and_iowait():
    stat = "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 1 5 100 7 1 1 0 0 0\ncpu1 20 0 0 50 0 0 0 3 0 0\nintr 5\n"
    assert busy_jiffies({0}, stat) == 18 and busy_jiffies({0, 1}, stat) == 41


@pytest.mark.parametrize(("cores", "elsewhere", "threads"), [(2, 0.0, 2), (2, 0.5, 2), (2, 1.0, 1), (2, 2.0, 1),
                                                              (16, 3.9, 12), (1, 0.0, 1)])
def test_threads_leave_out_the_cores_other_processes_keep_busy(cores, elsewhere, threads):
    assert threads_for(cores, elsewhere) == threads


@pytest.mark.skipif(len(os.sched_getaffinity(0)) > 8, reason="one busy loop per core")
def test_with_every_core_busy_elsewhere_the_forward_runs_on_one_thread():
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    share = FreeCoreThreads(sample_s=0.5).start()
    try:
        deadline = time.monotonic() + 10
        while share.threads != 1:
            assert time.monotonic() < deadline, f"still {share.threads} threads beside {len(spinners)} busy loops"
            time.sleep(0.1)
        model = torch.nn.Linear(4, 4)
        share.attach(model)
        seen = []
        model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
        worker = threading.Thread(target=lambda: model(torch.ones(1, 4)))  # as the engine's own thread
        worker.start()
        worker.join()
        assert seen == [1]
    finally:
        share.stop()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) > 8, reason="one busy loop per core")
def test_beside_busy_cores_the_engines_fused_forwards_run_on_one_thread():
    """The engine's CPU steps run `fused_forward`, which never calls the model's forward: the threads must still
    follow the free cores (a fused step ran on every core beside a busy one until the hook moved to the embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    share = FreeCoreThreads(sample_s=0.5).start()
    executor = TransformersExecutor(model, None, max_batch_size=2, kv_cache_memory_bytes=1 << 20)
    try:
        share.attach(model)
        deadline = time.monotonic() + 10
        while share.threads != 1:
            assert time.monotonic() < deadline, f"still {share.threads} threads beside {len(spinners)} busy loops"
            time.sleep(0.1)
        fused, seen = executor.runner.fused_forward, []
        assert fused is not None

        def recording(parts, pool, ends=None):
            logits = fused(parts, pool, ends)
            seen.append(torch.get_num_threads())  # on the engine's thread, as the forward left it
            return logits
        executor.runner.fused_forward = recording
        (steps,) = run_all(executor, [GenerationRequest(input_ids=[5, 6, 7], max_tokens=3, min_tokens=3)], 60)
        assert steps[-1].error is None
        assert seen and set(seen) == {1}, seen
    finally:
        executor.shutdown()
        share.stop()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


# -- across the boundary --------------------------------------------------------------------------------------------
def test_greedy_tokens_and_logits_are_the_same_as_with_the_engine_on_a_thread(executor, prompt):
    torch.set_num_threads(2)
    from trtllm_model.embedded.model_loading import load_model

    loaded = load_model()
    local = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, max_num_tokens=256)
    try:
        request = GenerationRequest(input_ids=prompt, max_tokens=6, return_context_logits=True,
                                    return_generation_logits=True, return_log_probs=True)
        remote_steps = run(executor, executor.enqueue(request))
        local_steps = run(local, local.enqueue(request))
    finally:
        local.shutdown()
    tokens = [token for step in remote_steps for token in step.token_ids]
    assert tokens == [token for step in local_steps for token in step.token_ids] and len(tokens) == 6
    assert "Paris" in executor.tokenizer().decode(tokens)
    context = next(step.context_logits for step in remote_steps if step.context_logits is not None)
    generation = np.concatenate([s.generation_logits for s in remote_steps if s.generation_logits is not None], axis=1)
    assert context.shape == (len(prompt), 49152) and generation.shape == (1, 6, 49152)
    assert generation[0].argmax(axis=1).tolist() == tokens  # greedy: each token is its logits' argmax
    local_context = next(step.context_logits for step in local_steps if step.context_logits is not None)
    np.testing.assert_allclose(context, local_context, atol=1e-3)
    assert remote_steps[-1].finish_reason is FinishReason.LENGTH
    assert remote_steps[-1].cum_log_prob == pytest.approx(sum(p for s in remote_steps for p in s.log_probs))


def test_cancel_ends_a_running_request_with_cancelled_and_the_stats_come_across(executor, prompt):
    executor.iteration_stats()
    request_id = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=4000, min_tokens=4000))
    steps, deadline = [], time.monotonic() + 60
    while not any(step.token_ids for step in steps):
        assert time.monotonic() < deadline
        steps += [step for step in executor.await_steps(1.0) if step.request_id == request_id]
    cancelled_at = time.monotonic()
    executor.cancel(request_id)
    steps += run(executor, request_id, timeout_s=10)
    assert time.monotonic() - cancelled_at < 5
    assert [step.is_final for step in steps].count(True) == 1 and steps[-1].finish_reason is FinishReason.CANCELLED
    stats = executor.iteration_stats()
    assert stats and max(s.active_requests for s in stats) == 1 and stats[0].max_active_requests == 4
    assert all(s.kv_cache is not None and s.kv_cache.max_blocks > 0 for s in stats)
    assert [s.iteration for s in stats] == sorted(s.iteration for s in stats)


def test_bad_requests_are_refused_at_enqueue_in_the_stub(executor, prompt):
    with pytest.raises(RequestRejected, match="max_num_tokens=256"):
        executor.enqueue(GenerationRequest(input_ids=[1] * 300, max_tokens=2))
    with pytest.raises(RequestRejected, match="beam_width=2") as refused:
        executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=2, beam_width=2))
    assert refused.value.unsupported
    with pytest.raises(RequestRejected, match="49152"):
        executor.enqueue(GenerationRequest(input_ids=[1, 49152], max_tokens=2))
    with pytest.raises(RequestRejected, match="8192 positions"):
        executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=8190))
    with pytest.raises(RequestRejected, match="top_p"):
        executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=2, top_p=1.5))
    # The engine still serves.
    assert run(executor, executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=2)))[-1].is_final


class RecordingSocket:
    """The stub's command socket, recording each message's kind and the request ids of a submits message."""

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket, self.sent = socket, []

    def send_multipart(self, frames: list, **kwargs) -> None:
        message = decode([bytes(frame) for frame in frames])
        self.sent.append((message[0], [request_id for request_id, _ in message[1]] if message[0] == "submits" else
                          list(message[1:])))
        self.socket.send_multipart(frames, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.socket, name)


def test_a_batchs_submits_go_as_one_message_when_it_ends_and_a_cancel_never_overtakes_them(executor, prompt):
    """Within `enqueue_together` (execute()'s batch) nothing is sent until the block ends, unless a cancel goes
    first: then the held submits go just before it. A request that cannot be encoded fails its own enqueue; the
    others of the batch run."""
    engine = executor.engine
    recording = engine._commands = RecordingSocket(engine._commands)
    try:
        with executor.enqueue_together():
            first = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=3))
            with pytest.raises(TypeError):
                executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=3, faults={"x": threading.Lock()}))
            second = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=4))
            assert recording.sent == []
        assert recording.sent == [("submits", [first, second])]
        assert run(executor, first)[-1].finish_reason is FinishReason.LENGTH and run(executor, second)[-1].is_final
        with executor.enqueue_together():
            third = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=4000, min_tokens=4000))
            executor.cancel(third)
            assert recording.sent[1:] == [("submits", [third]), ("cancel", [third])]
        assert len(recording.sent) == 3
    finally:
        engine._commands = recording.socket
    assert run(executor, third)[-1].finish_reason is FinishReason.CANCELLED


class BrokenSocket(RecordingSocket):
    def send_multipart(self, frames: list, **kwargs) -> None:
        raise zmq.ZMQError(zmq.ENOTSOCK)


def test_a_batch_that_cannot_reach_the_worker_reports_the_engine_dead_instead_of_leaving_its_requests_waiting():
    executor = new_process_executor()
    try:
        real = executor.engine._commands
        executor.engine._commands = BrokenSocket(real)
        with executor.enqueue_together():
            executor.enqueue(GenerationRequest(input_ids=[1, 2, 3], max_tokens=2))
        with pytest.raises(ExecutorError, match="engine worker unreachable"):
            executor.await_steps(0.1)
        with pytest.raises(ExecutorError, match="engine worker unreachable"):
            executor.enqueue(GenerationRequest(input_ids=[1, 2, 3], max_tokens=2))
        executor.engine._commands = real
    finally:
        executor.shutdown()


def test_the_queue_bound_counts_requests_waiting_in_the_worker(executor, prompt):
    long = GenerationRequest(input_ids=prompt, max_tokens=4000, min_tokens=4000)
    running = []
    for _ in range(2):  # max_batch_size 4: these run; two at a time, as the queue holds two until admitted
        pair = {executor.enqueue(long), executor.enqueue(long)}
        running += pair
        started, deadline = set(), time.monotonic() + 120
        while not pair <= started:  # their first tokens: admitted, and the worker has reported its queue since
            assert time.monotonic() < deadline
            started |= {step.request_id for step in executor.await_steps(0.1)}
    waiting = [executor.enqueue(long) for _ in range(2)]  # max_queue_size 2: these wait
    with pytest.raises(QueueFull):
        executor.enqueue(long)
    for request_id in running + waiting:
        executor.cancel(request_id)
    ended, deadline = set(), time.monotonic() + 30
    while len(ended) < 6:
        assert time.monotonic() < deadline
        ended |= {step.request_id for step in executor.await_steps(1.0) if step.is_final}
    assert ended == set(running + waiting)


def test_a_killed_worker_fails_await_and_enqueue_and_reports_why():
    executor = new_process_executor()
    try:
        prompt = executor.tokenizer().encode("Tell me a long story.")
        request_id = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=4000, min_tokens=4000))
        steps, deadline = [], time.monotonic() + 60
        while not steps:
            assert time.monotonic() < deadline
            steps = [step for step in executor.await_steps(1.0) if step.request_id == request_id]
        os.kill(executor.engine.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(ExecutorError, match="engine worker exited \\(killed by SIGKILL\\)"):
            while time.monotonic() - killed_at < 5:
                executor.await_steps(0.1)
        assert time.monotonic() - killed_at < 2
        assert "killed by SIGKILL" in executor.health_error()
        with pytest.raises(ExecutorError, match="SIGKILL"):
            executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=2))
        executor.cancel(request_id)  # quiet on a dead worker
    finally:
        executor.shutdown()
        executor.shutdown()  # idempotent


def test_an_engine_failure_in_the_worker_ends_the_stream_at_once_with_its_reason(tmp_path, monkeypatch):
    """The engine's own fault (here every decode forward raises) stops it inside the worker; the stub learns it with
    the engine's reason as soon as it happens, not after a heartbeat timeout, and refuses new requests."""
    (tmp_path / "failing_decode_worker.py").write_text(textwrap.dedent("""
        from trtllm_model.embedded.runner import ModelRunner
        from trtllm_model.executors import engine_worker

        def decode(self, *args, **kwargs):
            raise RuntimeError("device lost")

        def main(argv):
            ModelRunner.decode = decode
            engine_worker.main(argv)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import failing_decode_worker

    monkeypatch.setattr(engine_client, "engine_worker", failing_decode_worker)
    executor = new_process_executor(engine_heartbeat_timeout_s="60")
    try:
        prompt = executor.tokenizer().encode("Tell me a long story.")
        started = time.monotonic()
        request_id = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=64, min_tokens=64))
        with pytest.raises(ExecutorError, match="engine failed: RuntimeError: device lost"):
            while time.monotonic() - started < 30:
                assert all(step.request_id == request_id for step in executor.await_steps(0.1))
        assert time.monotonic() - started < 10  # the heartbeat timeout is 60 s
        assert "device lost" in executor.health_error()
        with pytest.raises(ExecutorError, match="device lost"):
            executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=2))
    finally:
        executor.shutdown()


def test_a_stopped_worker_is_reported_hung_after_the_heartbeat_timeout_and_not_before():
    executor = new_process_executor(engine_heartbeat_timeout_s="2")
    pid = executor.engine.process.pid
    try:
        time.sleep(3)  # nobody looks: the worker's heartbeats wait in the socket, and the first look reads them
        assert executor.await_steps(0.1) == [] and executor.health_error() is None
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        with pytest.raises(ExecutorError, match=r"engine worker hung: no heartbeat for 2\.\d s"):
            while time.monotonic() - stopped_at < 10:
                executor.await_steps(0.1)
        assert 1 <= time.monotonic() - stopped_at < 4  # 2 s after the last heartbeat, which came up to 1 s before
        assert "engine_heartbeat_timeout_s=2" in executor.health_error()
        with pytest.raises(ExecutorError, match="hung"):
            executor.enqueue(GenerationRequest(input_ids=[1, 2], max_tokens=2))
        started = time.monotonic()
        executor.shutdown()  # a hung worker is killed, not asked to stop
        assert time.monotonic() - started < 5 and executor.engine.process.returncode == -signal.SIGKILL
    finally:
        if executor.engine.process.poll() is None:
            os.kill(pid, signal.SIGCONT)
        executor.shutdown()


def test_after_shutdown_await_is_quiet_and_enqueue_fails():
    executor = new_process_executor()
    executor.shutdown()
    assert executor.engine.process.poll() == 0  # the worker exited by itself
    assert executor.await_steps(0.01) == [] and executor.health_error() is None
    with pytest.raises(ExecutorError, match="shut down"):
        executor.enqueue(GenerationRequest(input_ids=[1, 2], max_tokens=2))


def test_the_worker_exits_when_its_parent_is_killed(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{ROOT!r}, {ROOT + "/tests"!r}]
        from test_engine_process import new_process_executor
        executor = new_process_executor()
        print(executor.engine.process.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        worker_pid = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(worker_pid):
            assert time.monotonic() < deadline, "the worker outlived its parent"
            time.sleep(0.1)
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
