"""The poller without Triton: a list-backed stream stands in for the response sender; the executor is real."""

from __future__ import annotations

import threading
import time

import pytest

from trtllm_model.conventions.common import ParsedRequest
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.synthetic import SyntheticExecutor, synthetic_token
from trtllm_model.serving.poller import Poller
from trtllm_model.serving.request_context import ErrorCode, RequestContext


class ListStream:
    def __init__(self, fail_after: int | None = None) -> None:
        self.responses: list = []  # (outputs, final) or ("error", code, message)
        self.cancelled = False
        self.fail_after = fail_after
        self.done = threading.Event()

    def send(self, outputs, final):
        if self.fail_after is not None and len(self.responses) >= self.fail_after:
            raise RuntimeError("client gone")
        self.responses.append((outputs, final))
        if final:
            self.done.set()

    def send_error(self, code, message):
        self.responses.append(("error", code, message))
        self.done.set()

    def is_cancelled(self):
        return self.cancelled

    def tokens(self):
        return [int(t) for out, *_ in self.responses if isinstance(out, dict) for t in out["output_ids"].reshape(-1)]

    def finals(self):
        return sum(1 for r in self.responses if r[0] == "error" or r[1])


def context(ids, max_tokens, stream, streaming=True, **faults):
    request = GenerationRequest(
        input_ids=ids, max_tokens=max_tokens, streaming=streaming, exclude_input_in_output=False, faults=faults
    )
    return RequestContext(ParsedRequest(request, text_mode=False, prompt_ids=ids), stream)


@pytest.fixture
def poller():
    made = []

    def make(step_ms=2.0, **options):
        p = Poller(SyntheticExecutor(step_ms=step_ms, max_batch_size=64), **options)
        p.start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.shutdown()


def test_every_request_gets_its_tokens_and_one_final(poller):
    p = poller()
    streams = [ListStream() for _ in range(20)]
    for i, stream in enumerate(streams):
        p.submit(context([i], 10 + i, stream))
    for i, stream in enumerate(streams):
        assert stream.done.wait(10)
        assert stream.tokens() == [synthetic_token([i], k, 32000) for k in range(10 + i)]
        assert stream.finals() == 1
    assert p.open_requests == 0


def test_slow_sender_coalesces_steps_into_fewer_responses(poller):
    p = poller(step_ms=1.0, sender_threads=1)
    slow = ListStream()
    original = slow.send

    def slow_send(outputs, final):
        time.sleep(0.02)  # a slow IPC: steps pile up meanwhile
        original(outputs, final)

    slow.send = slow_send
    p.submit(context([1], 60, slow))
    assert slow.done.wait(10)
    assert slow.tokens() == [synthetic_token([1], k, 32000) for k in range(60)]
    assert len(slow.responses) < 30


def test_a_send_that_blocks_stalls_neither_the_executor_nor_other_streams(poller):
    # With one sender thread (two workers): while one worker is stuck in a send, the other keeps taking steps
    # from the executor and delivers the other stream; the stuck stream's steps wait in its mailbox and leave
    # together, in order, once the send returns.
    p = poller(step_ms=1.0, sender_threads=1)
    release = threading.Event()
    stuck = ListStream()
    original = stuck.send

    def blocking_send(outputs, final):
        release.wait(10)
        original(outputs, final)

    stuck.send = blocking_send
    p.submit(context([1], 40, stuck))
    time.sleep(0.05)  # the stuck stream's first send is now blocked
    other = ListStream()
    p.submit(context([2], 40, other))
    assert other.done.wait(5), "a blocked send stalled another stream"
    assert other.tokens() == [synthetic_token([2], k, 32000) for k in range(40)]
    assert not stuck.done.is_set()
    release.set()
    assert stuck.done.wait(5)
    assert stuck.tokens() == [synthetic_token([1], k, 32000) for k in range(40)]
    assert stuck.finals() == 1
    assert len(stuck.responses) <= 3  # the first token, then everything that piled up behind the blocked send


class SlowChannelStream(ListStream):
    """A response sender on one slow shared channel, as Triton's stub has one IPC channel for every send: sends take
    `send_s` each, one at a time. Each is logged (by stream name) as it begins: the order the dispatcher handed them
    out (a lock is not first come, first served: the order they leave says more about the test's threads)."""

    def __init__(self, name, sent: list, channel: threading.Lock, send_s: float) -> None:
        super().__init__()
        self.name, self.sent, self.channel, self.send_s = name, sent, channel, send_s
        self.submitted_at = 0  # sends logged before this request was submitted

    def send(self, outputs, final):
        self.sent.append(self.name)
        with self.channel:
            time.sleep(self.send_s)
            super().send(outputs, final)


def _start_running_streams(p, count, sent, channel, send_s):
    running = [SlowChannelStream(f"run-{i}", sent, channel, send_s) for i in range(count)]
    for i, stream in enumerate(running):
        p.submit(context([i], 1_000_000, stream))
    deadline = time.monotonic() + 10
    while not all(stream.responses for stream in running):
        assert time.monotonic() < deadline, "the running streams never got their first responses"
        time.sleep(0.01)
    return running


def _arrivals(p, sent, channel, send_s, every_s, seconds):
    """New 1-token requests, one every `every_s` for `seconds`, each noting how many sends left before it came."""
    arrived = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stream = SlowChannelStream(f"new-{len(arrived)}", sent, channel, send_s)
        stream.submitted_at = len(sent)
        p.submit(context([100 + len(arrived)], 1, stream))
        arrived.append(stream)
        time.sleep(every_s)
    return arrived


def test_running_streams_are_served_round_robin_while_new_requests_keep_arriving(poller):
    # Sends at 3 ms, one at a time (~330 a second); new requests arrive faster than that (one every 1.5 ms). When
    # first tokens went first, the running streams got nothing while the arrivals lasted. Now every running stream
    # gets its next response within one round (the other running streams and as many first responses), give or take
    # the sends the 3 workers had taken meanwhile and thread scheduling on a busy machine (up to 36 seen under a
    # concurrent `make test`; the bound allows 45).
    p = poller(step_ms=1.0, sender_threads=2)
    sent, channel, count = [], threading.Lock(), 10
    running = _start_running_streams(p, count, sent, channel, 0.003)
    start = len(sent)
    _arrivals(p, sent, channel, 0.003, 0.0015, 1.0)
    window = sent[start:]
    assert sum(name.startswith("new-") for name in window) > 50, "the arrivals did not compete for the sends"
    for stream in running:
        positions = [i for i, name in enumerate(window) if name == stream.name]
        assert len(positions) >= 3, f"{stream.name}: {len(positions)} responses in {len(window)} sends"
        gaps = [b - a for a, b in zip([0, *positions], positions)]
        # Starved (first tokens first), a running stream waits the whole arrival window (about 300 sends).
        assert max(gaps) <= 3 * count + 15, f"{stream.name} waited {max(gaps)} sends for a response"


def test_a_new_request_is_not_starved_by_running_streams_with_tokens_waiting(poller):
    # 30 running streams always have tokens waiting; a new request arriving now and then gets its first (and
    # only) response within a few sends (the 3 workers' sends under way, the step, a running stream's turn), not
    # after a round of the 30 running streams.
    p = poller(step_ms=1.0, sender_threads=2)
    sent, channel = [], threading.Lock()
    _start_running_streams(p, 30, sent, channel, 0.002)
    arrived = _arrivals(p, sent, channel, 0.002, 0.05, 1.0)
    for stream in arrived:
        assert stream.done.wait(5)
        waited = sent.index(stream.name) - stream.submitted_at
        assert waited <= 10, f"{stream.name} waited {waited} sends for its first response"


def test_failed_send_ends_only_that_stream(poller):
    p = poller()
    broken, healthy = ListStream(fail_after=2), ListStream()
    p.submit(context([1], 50, broken))
    p.submit(context([2], 50, healthy))
    assert healthy.done.wait(10)
    assert healthy.tokens() == [synthetic_token([2], k, 32000) for k in range(50)]
    time.sleep(0.1)
    assert p.open_requests == 0
    again = ListStream()
    p.submit(context([3], 3, again))
    assert again.done.wait(5) and again.finals() == 1


def test_client_cancel_reaches_the_executor_and_ends_with_cancelled(poller):
    p = poller(step_ms=5.0, cancel_check_s=0.05)
    stream = ListStream()
    p.submit(context([1], 100000, stream))
    time.sleep(0.1)
    stream.cancelled = True
    started = time.monotonic()
    assert stream.done.wait(2)
    assert time.monotonic() - started < 0.2
    assert stream.responses[-1][:2] == ("error", ErrorCode.CANCELLED)
    assert p.open_requests == 0


def test_executor_crash_fails_every_stream_and_refuses_new_work(poller):
    failures = []
    p = poller(on_failure=failures.append)
    victims = [ListStream() for _ in range(5)]
    for i, stream in enumerate(victims):
        p.submit(context([i], 10000, stream))
    crasher = ListStream()
    p.submit(context([9], 10000, crasher, crash_at="3"))
    for stream in victims + [crasher]:
        assert stream.done.wait(1.0)
        assert stream.responses[-1][:2] == ("error", ErrorCode.UNAVAILABLE)
        assert stream.finals() == 1
    assert failures and "crash" in failures[0]
    late = ListStream()
    p.submit(context([1], 3, late))
    assert late.responses[-1][:2] == ("error", ErrorCode.UNAVAILABLE)


def test_shutdown_ends_open_streams_with_unavailable_and_joins_threads(poller):
    p = poller()
    streams = [ListStream() for _ in range(10)]
    for i, stream in enumerate(streams):
        p.submit(context([i], 100000, stream))
    time.sleep(0.05)
    p.shutdown()
    for stream in streams:
        assert stream.finals() == 1
        assert stream.responses[-1][0] == "error" and "shutting down" in stream.responses[-1][2]
    assert not any(t.is_alive() for t in p.dispatcher._threads) and not p.watch._thread.is_alive()


def test_queue_bound_refuses_with_unavailable(poller):
    p = poller(step_ms=50.0, max_open_requests=3)
    streams = [ListStream() for _ in range(5)]
    for i, stream in enumerate(streams):
        p.submit(context([i], 1000, stream))
    refused = [s for s in streams if s.responses and s.responses[-1][0] == "error"]
    assert len(refused) == 2
    assert all(s.responses[-1][1] is ErrorCode.UNAVAILABLE for s in refused)


def test_non_streaming_sends_one_response_with_everything(poller):
    p = poller()
    stream = ListStream()
    p.submit(context([4], 12, stream, streaming=False))
    assert stream.done.wait(5)
    assert len(stream.responses) == 1
    assert stream.tokens() == [4] + [synthetic_token([4], k, 32000) for k in range(12)]


def test_a_bug_while_building_a_response_still_ends_the_request_with_an_error(poller):
    class BrokenDetokenizer:
        def push(self, tokens):
            raise ValueError("detokenizer bug")

    p = poller(detokenizer_factory=BrokenDetokenizer)
    stream = ListStream()
    ctx = context([1], 5, stream)
    ctx.parsed.text_mode = True
    p.submit(ctx)
    assert stream.done.wait(5)
    assert stream.finals() == 1
    assert stream.responses[-1][:2] == ("error", ErrorCode.INTERNAL) and "detokenizer bug" in stream.responses[-1][2]
    assert p.open_requests == 0


def test_a_failure_while_building_the_final_response_still_sends_a_final_error(poller):
    # The last response is built after the request is known to end: a detokenizer whose flush() raises there
    # must not leave the client waiting (the request used to be marked ended before its final was built).
    class FlushFails:
        def push(self, tokens):
            return "x" * len(tokens)

        def flush(self):
            raise ValueError("flush bug")

    p = poller(detokenizer_factory=FlushFails)
    for streaming in (True, False):
        stream = ListStream()
        ctx = context([1], 4, stream, streaming=streaming)
        ctx.parsed.text_mode = True
        p.submit(ctx)
        assert stream.done.wait(5), "no final response"
        assert stream.finals() == 1
        assert stream.responses[-1][:2] == ("error", ErrorCode.INTERNAL) and "flush bug" in stream.responses[-1][2]
    assert p.open_requests == 0


class SlowEnqueue(SyntheticExecutor):
    def __init__(self, release: threading.Event, **kwargs) -> None:
        super().__init__(**kwargs)
        self.release = release

    def enqueue(self, request):
        if request.input_ids == [99]:
            self.release.wait(10)  # as trtllm_llmapi's enqueue waiting on its event loop (up to 60 s)
        return super().enqueue(request)


def test_a_slow_enqueue_holds_no_lock_the_other_streams_need():
    release = threading.Event()
    p = Poller(SlowEnqueue(release, step_ms=1.0, max_batch_size=64), cancel_check_s=0.02)
    p.start()
    try:
        running, cancelled = ListStream(), ListStream()
        p.submit(context([1], 30, running))
        p.submit(context([2], 100000, cancelled))
        slow = ListStream()
        blocked = threading.Thread(target=p.submit, args=(context([99], 3, slow),))
        blocked.start()
        time.sleep(0.05)
        # While that enqueue waits: steps are routed, cancellations are checked, the registry answers.
        assert running.done.wait(2), "a slow enqueue stalled the other streams"
        cancelled.cancelled = True
        assert cancelled.done.wait(2), "a slow enqueue stalled the cancel watch"
        assert p.open_requests == 0
        release.set()
        blocked.join(5)
        assert slow.done.wait(5) and slow.finals() == 1
        assert slow.tokens() == [synthetic_token([99], k, 32000) for k in range(3)]
    finally:
        release.set()
        p.shutdown()


def test_an_unload_check_that_errors_is_not_an_unload(poller):
    def broken():
        raise OSError("connection refused")

    p = poller(cancel_check_s=0.01, unloading=broken)
    stream = ListStream()
    p.submit(context([1], 40, stream))
    assert stream.done.wait(5)
    assert stream.finals() == 1 and stream.responses[-1][0] != "error"
    assert p.accepting


def test_a_confirmed_unload_ends_the_streams_and_readiness_falls(poller):
    unloading = threading.Event()
    p = poller(cancel_check_s=0.01, unloading=unloading.is_set)
    stream = ListStream()
    p.submit(context([1], 100000, stream))
    time.sleep(0.05)
    assert p.accepting
    unloading.set()
    assert stream.done.wait(2)
    assert stream.responses[-1][:2] == ("error", ErrorCode.UNAVAILABLE)
    assert not p.accepting
    late = ListStream()
    p.submit(context([1], 3, late))
    assert late.responses[-1][:2] == ("error", ErrorCode.UNAVAILABLE)


def test_readiness_falls_when_the_executor_fails(poller):
    p = poller()
    stream = ListStream()
    p.submit(context([9], 10000, stream, crash_at="2"))
    assert stream.done.wait(2)
    assert not p.accepting


def test_on_finished_runs_once_per_request_before_its_final_response_is_sent(poller):
    # NVIDIA's metric checks read the histograms right after the final response: the metrics hook must come first,
    # once, also when the final send fails (the client left) or the final is an error.
    class FlushFails:
        def push(self, tokens):
            return "x" * len(tokens)

        def flush(self):
            raise ValueError("flush bug")

    seen: dict[int, list[int]] = {}

    def on_finished(ctx):  # how many responses the stream had when the hook ran
        seen.setdefault(ctx.parsed.prompt_ids[0], []).append(len(ctx.stream.responses))

    p = poller(on_finished=on_finished, detokenizer_factory=FlushFails)
    ok, gone_at_final, bug = ListStream(), ListStream(fail_after=0), ListStream()
    p.submit(context([1], 3, ok, streaming=False))
    p.submit(context([2], 3, gone_at_final, streaming=False))
    text = context([3], 4, bug)
    text.parsed.text_mode = True
    p.submit(text)
    assert ok.done.wait(5) and bug.done.wait(5)
    deadline = time.monotonic() + 5
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == {1: [0], 2: [0], 3: [len(bug.responses) - 1]}
    assert ok.finals() == 1 and bug.finals() == 1 and bug.responses[-1][0] == "error"


class SlowGuides(SyntheticExecutor):
    """Guided requests take `compile_s` in enqueue, as the embedded engine's guide compilation can."""

    def __init__(self, compile_s: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.compile_s = compile_s

    def enqueue(self, request):
        if request.guided_decoding_type is not None:
            time.sleep(self.compile_s)
        return super().enqueue(request)


def guided_context(ids, max_tokens, stream):
    ctx = context(ids, max_tokens, stream)
    ctx.parsed.generation.guided_decoding_type, ctx.parsed.generation.guided_decoding_guide = "regex", "[a-z]+"
    return ctx


def test_a_guide_that_compiles_slowly_holds_neither_execute_nor_the_requests_behind_it():
    p = Poller(SlowGuides(1.0, step_ms=1.0, max_batch_size=64))
    p.start()
    try:
        guided, plain = ListStream(), ListStream()
        started = time.monotonic()
        p.submit(guided_context([7], 3, guided))
        p.submit(context([1], 3, plain))
        assert time.monotonic() - started < 0.5, "submit waited for the guide to compile"
        assert plain.done.wait(0.5) and not guided.done.is_set(), "the plain request waited behind the guided one"
        assert guided.done.wait(5) and guided.finals() == 1
        assert guided.tokens() == [synthetic_token([7], k, 32000) for k in range(3)]
    finally:
        p.shutdown()


def test_a_guided_request_still_compiling_at_shutdown_gets_one_final_unavailable():
    p = Poller(SlowGuides(0.5, step_ms=1.0, max_batch_size=64))
    p.start()
    guided = ListStream()
    p.submit(guided_context([7], 3, guided))
    p.shutdown()
    assert guided.done.wait(5) and guided.finals() == 1
    assert guided.responses == [("error", ErrorCode.UNAVAILABLE, "model not ready: shutting down")]


def test_guided_requests_waiting_for_admission_count_against_the_request_bound():
    # A flood of slow guides cannot queue without end behind the admission threads: each waiting one holds a place.
    p = Poller(SlowGuides(1.0, step_ms=1.0, max_batch_size=64), max_open_requests=2)
    p.start()
    try:
        waiting = [ListStream(), ListStream()]
        for i, stream in enumerate(waiting):
            p.submit(guided_context([7 + i], 2, stream))
        over = ListStream()
        p.submit(guided_context([9], 2, over))
        assert over.done.is_set(), "the request over the bound was not answered at once"
        assert over.responses[0][:2] == ("error", ErrorCode.UNAVAILABLE) and "requests in flight" in over.responses[0][2]
        for stream in waiting:
            assert stream.done.wait(5) and stream.finals() == 1 and stream.responses[-1][0] != "error"
    finally:
        p.shutdown()
