"""Rows of batched requests share a bounded part of the batch slots (issue 31 item 5): the poller with a real
synthetic executor; a list-backed stream stands in for Triton's response sender, BatchStream is the real one."""

from __future__ import annotations

import threading
import time

import pytest
from test_poller import ListStream, context

from trtllm_model.executors.synthetic import SyntheticExecutor, synthetic_token
from trtllm_model.serving.poller import Poller
from trtllm_model.serving.request_context import BatchStream, ErrorCode
from trtllm_model.serving.row_admission import default_limit


class CountingExecutor(SyntheticExecutor):
    """Counts the requests the engine holds (enqueued, final step not yet returned) and the most it ever held."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.count_lock = threading.Lock()
        self.held = 0
        self.peak = 0
        self.enqueued: list[list[int]] = []

    def enqueue(self, request):
        with self.count_lock:
            self.held += 1
            self.peak = max(self.peak, self.held)
            self.enqueued.append(list(request.input_ids))
        return super().enqueue(request)

    def await_steps(self, timeout_s):
        steps = super().await_steps(timeout_s)
        with self.count_lock:
            self.held -= sum(1 for step in steps if step.is_final)
        return steps


@pytest.fixture
def gated():
    made = []

    def make(limit, step_ms=2.0, **options):
        executor = CountingExecutor(step_ms=step_ms, max_batch_size=64)
        p = Poller(executor, max_batched_rows=limit, **options)
        p.start()
        made.append(p)
        return p, executor

    yield make
    for p in made:
        p.shutdown()


def batched(rows: int, max_tokens: int, first_id: int = 0):
    stream = ListStream()
    members = BatchStream(stream, rows).members
    return stream, [context([first_id + i], max_tokens, member) for i, member in enumerate(members)]


def test_the_default_share_is_half_the_slots():
    assert default_limit(32) == 16 and default_limit(1) == 1 and default_limit(None) is None


def test_a_batched_request_runs_at_most_its_share_of_rows_and_every_row_ends_once(gated):
    p, executor = gated(limit=4)
    stream, rows = batched(16, 8)
    p.submit_rows(rows)
    assert stream.done.wait(10)
    assert executor.peak == 4
    finals = [r for r in stream.responses if r[0] != "error" and r[1]]
    assert len(finals) == 1 and stream.responses[-1] is finals[0]  # the stream's one FINAL, after every row
    by_row: dict[int, list[int]] = {}
    for outputs, _final in stream.responses:
        by_row.setdefault(int(outputs["batch_index"][0][0]), []).extend(int(t) for t in outputs["output_ids"].reshape(-1))
    assert by_row == {i: [synthetic_token([i], k, 32000) for k in range(8)] for i in range(16)}
    assert p.open_requests == 0


def test_single_row_requests_never_wait_behind_batched_rows(gated):
    p, executor = gated(limit=2, step_ms=5.0)
    flood, rows = batched(8, 400)  # about 2 s a row: the share stays taken
    p.submit_rows(rows)
    time.sleep(0.05)
    victim = ListStream()
    started = time.monotonic()
    p.submit_rows([context([100], 4, victim)])
    assert victim.done.wait(5)
    assert time.monotonic() - started < 1.0
    assert victim.tokens() == [synthetic_token([100], k, 32000) for k in range(4)]
    assert executor.peak == 3  # two flood rows and the victim
    assert not flood.done.is_set()


def test_two_batched_requests_take_turns_at_the_slots(gated):
    p, executor = gated(limit=2)
    first, first_rows = batched(6, 4, first_id=0)
    second, second_rows = batched(6, 4, first_id=100)
    p.submit_rows(first_rows)
    p.submit_rows(second_rows)
    assert first.done.wait(10) and second.done.wait(10)
    # The first request took both slots; after that the rows went in turn, one of each request.
    order = ["a" if ids[0] < 100 else "b" for ids in executor.enqueued]
    assert order[:2] == ["a", "a"] and "aaa" not in "".join(order[2:]) and order.count("b") == 6


def test_a_cancelled_batched_request_ends_its_waiting_rows_without_the_engine(gated):
    p, executor = gated(limit=2, step_ms=5.0, cancel_check_s=0.02)
    stream, rows = batched(12, 2000)
    p.submit_rows(rows)
    time.sleep(0.1)
    stream.cancelled = True  # the client left: its request's rows waiting for a slot never reach the engine
    assert stream.done.wait(5)
    assert stream.responses[-1][:2] == ("error", ErrorCode.CANCELLED)
    assert len(executor.enqueued) == 2
    deadline = time.monotonic() + 5
    while (p.open_requests or executor.held) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.open_requests == 0 and executor.held == 0


def test_a_request_waiting_for_its_first_slot_is_cancelled_while_it_waits(gated):
    p, executor = gated(limit=2, step_ms=5.0, cancel_check_s=0.02)
    holder, holder_rows = batched(2, 2000)
    waiting, waiting_rows = batched(4, 8, first_id=100)
    p.submit_rows(holder_rows)
    p.submit_rows(waiting_rows)
    time.sleep(0.05)
    waiting.cancelled = True
    assert waiting.done.wait(2), "a request with no row in the engine was not watched for cancellation"
    assert waiting.responses[-1][:2] == ("error", ErrorCode.CANCELLED)
    assert all(ids[0] < 100 for ids in executor.enqueued)
    assert not holder.done.is_set()


def test_a_stop_ends_the_waiting_rows_with_the_tokens_so_far(gated):
    p, executor = gated(limit=1, step_ms=5.0)
    stream, rows = batched(3, 2000)
    for row in rows:
        row.triton_request_id = "batch-1"
    p.submit_rows(rows)
    time.sleep(0.05)
    stopper = ListStream()
    stop = context([0], 1, stopper)
    stop.parsed.stop_only = True
    stop.triton_request_id = "batch-1"
    p.submit_rows([stop])
    assert stream.done.wait(5)
    assert all(r[0] != "error" for r in stream.responses)  # `stop` ends rows normally, finish reason cancelled
    assert len(executor.enqueued) == 1


def test_held_rows_count_against_the_request_bound(gated):
    p, _executor = gated(limit=2, step_ms=5.0, max_open_requests=10)
    holder, holder_rows = batched(8, 400)
    p.submit_rows(holder_rows)
    refused, refused_rows = batched(3, 4, first_id=100)  # 8 + 3 > 10: refused as a whole
    p.submit_rows(refused_rows)
    assert refused.done.wait(2)
    assert refused.responses[0][:2] == ("error", ErrorCode.UNAVAILABLE)
    assert len(refused.responses) == 1
    deadline = time.monotonic() + 2
    while p.open_requests != 8 and time.monotonic() < deadline:  # the admitted rows' enqueue runs on its own thread
        time.sleep(0.01)
    assert p.open_requests == 8 and not holder.done.is_set()


def test_shutdown_ends_rows_still_waiting_with_unavailable(gated):
    p, _executor = gated(limit=1, step_ms=5.0)
    stream, rows = batched(4, 2000)
    p.submit_rows(rows)
    time.sleep(0.05)
    p.shutdown()
    assert stream.done.wait(5)
    assert stream.responses[-1][:2] == ("error", ErrorCode.UNAVAILABLE)


def test_batched_rows_hold_at_most_half_the_request_bound_and_one_row_requests_keep_the_rest(gated):
    p, _executor = gated(limit=2, step_ms=5.0, max_open_requests=12)
    first, first_rows = batched(4, 400)
    p.submit_rows(first_rows)
    second, second_rows = batched(3, 4, first_id=100)  # 4 + 3 > 12 // 2
    p.submit_rows(second_rows)
    assert second.done.wait(2)
    assert second.responses[0][:2] == ("error", ErrorCode.UNAVAILABLE) and "batched" in second.responses[0][2]
    singles = [ListStream() for _ in range(6)]
    for i, single in enumerate(singles):
        p.submit_rows([context([200 + i], 2, single)])
    for i, single in enumerate(singles):
        assert single.done.wait(5) and single.tokens() == [synthetic_token([200 + i], k, 32000) for k in range(2)]
    assert not first.done.is_set()
