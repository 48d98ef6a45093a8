"""Several stubs sharing one engine worker (executors/engine_client.py `shared_as`, the instances of one model on one
device): they attach to one process up to `peers`, each gets the steps of its own requests only and the same greedy
tokens as alone, the iteration stats reach one of them, a stub beyond `peers` (in the worker's life) gets a worker of
its own, a stub that leaves has its requests cancelled while the others go on (after a bye; a stub killed ends the
others' engine with the reason), the worker exits when the last one leaves, and a hello it takes after its stub gave up counts no stub."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import zmq

from trtllm_model.executor_interface import ExecutorError, FinishReason, GenerationRequest
from trtllm_model.executors.engine_wire import decode, encode, new_socket
from trtllm_model.executors.transformers_executor import PARAMETERS, TransformersExecutor, create
from trtllm_model.params import Params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAW = {"engine_process": "true", "max_batch_size": "8", "max_num_tokens": "256", "dtype": "float32"}


def shared_executor(key: str, peers: int) -> TransformersExecutor:
    return create(Params(RAW, PARAMETERS), shared_as=key, peers=peers)


def collect(executor: TransformersExecutor, ids: list[int], timeout_s: float = 120.0) -> dict[int, list]:
    """Each request's steps once all have their final; a step of any other request fails the test."""
    steps: dict[int, list] = {request_id: [] for request_id in ids}
    deadline = time.monotonic() + timeout_s
    while not all(s and s[-1].is_final for s in steps.values()):
        assert time.monotonic() < deadline, "requests did not finish in time"
        for step in executor.await_steps(1.0):
            assert step.request_id in steps, f"a step of request {step.request_id}, not one of this stub's {ids}"
            steps[step.request_id].append(step)
    return steps


def greedy(executor: TransformersExecutor, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
    ids = [executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=max_tokens)) for prompt in prompts]
    steps = collect(executor, ids)
    return [[token for step in steps[request_id] for token in step.token_ids] for request_id in ids]


def exited(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def pair():
    key = f"test-{uuid.uuid4()}"
    first = shared_executor(key, peers=2)
    second = shared_executor(key, peers=2)
    yield key, first, second
    second.shutdown()
    first.shutdown()


def test_two_stubs_attach_to_one_worker_and_each_gets_its_own_requests_with_the_tokens_of_one_alone(pair):
    key, first, second = pair
    assert first.engine.info.pid == second.engine.info.pid == first.engine.process.pid
    assert second.engine.process is None  # attached, not started
    assert (first.engine.number, second.engine.number) == (1, 2)
    tokenizer = first.tokenizer()
    prompts = [tokenizer.encode(text) for text in ("The capital of France is", "One, two, three,", "Water is")]
    alone = greedy(first, prompts)
    # Both at once: the engine batches them together; each stub must see its own requests' steps only.
    ids_first = [first.enqueue(GenerationRequest(input_ids=p, max_tokens=8)) for p in prompts]
    ids_second = [second.enqueue(GenerationRequest(input_ids=p, max_tokens=8)) for p in prompts]
    assert not set(ids_first) & set(ids_second)
    seen_first, seen_second = collect(first, ids_first), collect(second, ids_second)
    assert set(seen_first) == set(ids_first) and set(seen_second) == set(ids_second)
    for seen, ids in ((seen_first, ids_first), (seen_second, ids_second)):
        tokens = [[token for step in seen[request_id] for token in step.token_ids] for request_id in ids]
        assert tokens == alone
        assert all(seen[request_id][-1].finish_reason is FinishReason.LENGTH for request_id in ids)


def test_the_iteration_stats_reach_one_stub_only(pair):
    _, first, second = pair
    first.iteration_stats(), second.iteration_stats()
    greedy(second, [[1, 2, 3]], max_tokens=4)
    time.sleep(1.5)  # a heartbeat's message after the last iteration
    first.await_steps(0.1), second.await_steps(0.1)
    assert first.iteration_stats() and not second.iteration_stats()


def test_a_stub_beyond_peers_gets_a_worker_of_its_own(pair):
    key, first, _ = pair
    third = shared_executor(key, peers=2)  # as a reload's instance, while the two still serve
    try:
        assert third.engine.process is not None and third.engine.info.pid != first.engine.info.pid
        assert greedy(third, [[1, 2, 3]], max_tokens=3)[0]
    finally:
        third.shutdown()
    assert exited(third.engine.info.pid, 10)


def test_a_stub_leaving_while_its_poll_is_under_way_gets_the_answer_to_its_bye_at_once():
    """The poller's thread may be inside `await_steps` when finalize stops the executor: that poll, not the bye,
    can read the worker's answer. Lost there, the bye waited its whole 30 s and then killed the shared worker."""
    key = f"test-{uuid.uuid4()}"
    first = shared_executor(key, peers=2)
    second = shared_executor(key, peers=2)
    try:
        polling = threading.Thread(target=second.await_steps, args=(3.0,))
        polling.start()
        time.sleep(0.2)  # the poll holds the receive lock, waiting
        started = time.monotonic()
        second.shutdown()
        assert time.monotonic() - started < 5.0, "the bye's answer was lost"
        polling.join()
        assert not exited(first.engine.info.pid, 0.5), "the worker was killed"
        assert greedy(first, [[1, 2, 3]], max_tokens=3)[0]
    finally:
        second.shutdown()
        first.shutdown()


def test_a_killed_stub_fails_the_others_engine_naming_it_and_the_last_bye_ends_the_worker():
    """Triton never answers a killed stub's open requests nor restarts it: the other instances cannot go on serving
    a model with a dead instance, so the worker tells them, as an engine failure (their model then reports not ready
    until it is reloaded)."""
    key = f"test-{uuid.uuid4()}"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{ROOT!r}, {ROOT + "/tests"!r}]
        from test_shared_engine import shared_executor
        from trtllm_model.executor_interface import GenerationRequest
        executor = shared_executor({key!r}, peers=2)
        for _ in range(3):
            executor.enqueue(GenerationRequest(input_ids=[1, 2, 3], max_tokens=4000, min_tokens=4000))
        print(executor.engine.info.pid, flush=True)
        time.sleep(600)
    """)
    stub = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        worker_pid = int(stub.stdout.readline())
        mine = shared_executor(key, peers=2)
        assert mine.engine.info.pid == worker_pid and mine.engine.process is None
        stub.kill()
        stub.wait()
        deadline = time.monotonic() + 30
        with pytest.raises(ExecutorError, match="instance stub 1 of this engine ended without leaving"):
            while True:
                assert time.monotonic() < deadline, "the other stub was never told"
                mine.await_steps(0.2)
        with pytest.raises(ExecutorError, match="ended without leaving"):
            mine.enqueue(GenerationRequest(input_ids=[1, 2, 3], max_tokens=4))
        # The killed stub's place is not taken: a new stub (as a reload's) gets a worker of its own.
        newcomer = shared_executor(key, peers=2)
        assert newcomer.engine.process is not None and newcomer.engine.info.pid != worker_pid
        newcomer.shutdown()
        mine.shutdown()
        assert exited(worker_pid, 10), "the worker outlived its last stub"
    finally:
        stub.kill()


def test_a_hello_the_worker_takes_after_its_stub_gave_up_attaches_nothing(tmp_path, capfd):
    """As when the worker's command loop was busy past a joining stub's wait: the hello reaches it late. Counted as
    attached, that stub (this process, alive) would hold the worker after its last real stub left."""
    key = f"test-{uuid.uuid4()}"
    first = shared_executor(key, peers=2)
    worker = first.engine.info.pid
    context = zmq.Context()
    try:
        events = new_socket(context, zmq.PULL)
        events.bind(f"ipc://{tmp_path}/events")
        commands = new_socket(context, zmq.PUSH)
        commands.connect(f"ipc://{first.engine._worker_dir}/commands")
        commands.send_multipart(encode(("hello", os.getpid(), f"ipc://{tmp_path}/events", 2, time.monotonic() - 1)))
        assert not events.poll(2000), decode(events.recv_multipart())  # no "ready": nothing attached
        assert "after its stub gave up: ignored" in capfd.readouterr().err
        first.shutdown()
        assert exited(worker, 10), "a hello taken late kept the worker for a stub that never came"
    finally:
        first.shutdown()
        context.destroy(linger=0)
