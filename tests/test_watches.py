"""The stream watches without Triton: readiness over HTTP (only the server's own answer counts) and the watch loop."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from trtllm_model.server import free_ports
from trtllm_model.serving.watches import StreamWatch, UnloadProbe


@pytest.fixture
def ready_server():
    """A loopback HTTP server answering /v2/models/<name>/ready with the status set in `answers`."""
    answers = {"tensorrt_llm": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            name = self.path.split("/")[3]
            self.send_response(answers.get(name, 400))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", answers
    server.shutdown()


def test_only_the_servers_own_not_ready_answer_is_an_unload(ready_server):
    url, answers = ready_server
    probe = UnloadProbe(url, "tensorrt_llm")
    assert not probe()
    answers["tensorrt_llm"] = 400  # what tritonserver answers for a model being unloaded
    assert probe()


def test_not_ready_before_the_model_was_ever_ready_is_a_load_not_an_unload(ready_server):
    # An idle instance asks from its start, while tritonserver still loads the other models (serve's guard answers
    # 503 then): that once ended a fresh instance's executor before its model had served anything.
    url, answers = ready_server
    probe = UnloadProbe(url, "tensorrt_llm")
    answers["tensorrt_llm"] = 503
    assert not probe() and not probe()
    answers["tensorrt_llm"] = 200
    assert not probe()
    answers["tensorrt_llm"] = 503
    assert probe()


def test_a_proxy_in_the_environment_is_not_asked(ready_server, monkeypatch):
    # urllib honoured http_proxy: a proxy that refuses (or answers 502) made the model stop serving for good.
    url, _ = ready_server
    (dead,) = free_ports(1)
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{dead}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert not UnloadProbe(url, "tensorrt_llm")()


def test_an_address_that_never_answered_is_no_confirmation():
    (dead,) = free_ports(1)
    probe = UnloadProbe(f"http://127.0.0.1:{dead}", "tensorrt_llm")
    assert not probe() and not probe()  # refused, and never answered: a wrong address, not a stop


def test_an_answer_that_is_not_http_is_no_confirmation(ready_server):
    url, _ = ready_server
    probe = UnloadProbe(url, "tensorrt_llm")
    assert not probe()  # seen ready
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_garbage():
        for answer in (b"SSH-2.0-not-http\r\n", b""):
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                connection.sendall(answer)

    threading.Thread(target=answer_garbage, daemon=True).start()
    probe.port = listener.getsockname()[1]
    assert not probe() and not probe()  # a foreign answer, then a closed connection: unknown, not an unload
    listener.close()


def test_the_servers_address_closing_after_it_answered_is_a_stop(ready_server):
    # tritonserver closes its HTTP endpoint as soon as it starts to stop (seen: refused within 0.2 s of SIGTERM).
    url, _ = ready_server
    probe = UnloadProbe(url, "tensorrt_llm")
    assert not probe()
    (dead,) = free_ports(1)
    probe.port = dead  # as if the listener closed
    assert probe()


def make_watch(items, lock, **kwargs):
    asked = []

    def is_cancelled(item):
        asked.append((item, lock.locked()))
        return item == "cancel-me"

    cancelled = []
    watch = StreamWatch("test-watch", 0.01, open_items=lambda: list(items), is_cancelled=is_cancelled,
                        on_cancelled=cancelled.append, **kwargs)
    return watch, asked, cancelled


def test_the_watch_asks_each_item_outside_the_registry_lock_and_reports_cancellations():
    lock = threading.Lock()
    items = ["a", "cancel-me"]

    def snapshot():
        with lock:  # as the models take their registry lock for the snapshot only
            return list(items)

    watch, asked, cancelled = make_watch(items, lock)
    watch._open_items = snapshot
    watch.start()
    try:
        deadline = time.monotonic() + 2
        while not cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cancelled and cancelled[0] == "cancel-me"
        assert asked and not any(held for _, held in asked), "asked while holding the lock execute() needs"
    finally:
        watch.stop()


def test_an_unload_is_reported_and_nothing_is_asked_after_it():
    lock = threading.Lock()
    unloads = []
    watch, asked, _ = make_watch(["a"], lock, unloading=lambda: True, on_unload=lambda: unloads.append(1))
    watch.start()
    try:
        time.sleep(0.1)
        assert watch.unload_seen and unloads
        assert not asked
    finally:
        watch.stop()


def test_questions_beyond_the_budget_are_asked_in_turn_so_every_item_is_reached():
    """At most max_questions_per_s * period_s questions a round (each is an IPC round trip on the channel the sends
    need); the rounds take the items in turn, so each is asked within items / questions_per_round rounds."""
    items = [f"item-{i}" for i in range(10)]
    asked: list[list[str]] = []
    watch = StreamWatch("test-watch", 0.01, open_items=lambda: list(items), is_cancelled=lambda item: False,
                        on_cancelled=lambda item: None, max_questions_per_s=300)  # 3 a round
    assert watch.questions_per_round == 3
    for _ in range(4):
        asked.append(watch._this_rounds(items))
    assert all(len(round_) == 3 for round_ in asked)
    assert {item for round_ in asked for item in round_} == set(items)  # 4 rounds of 3 reach all 10
    assert asked[0] == ["item-0", "item-1", "item-2"] and asked[1] == ["item-3", "item-4", "item-5"]
    few = items[:2]
    assert watch._this_rounds(few) == few  # under the budget: everyone, every round


def test_items_opened_while_the_watch_is_watching_keep_its_rounds_to_their_period():
    """notify() wakes an idle watch only: woken by every new request (execute() notifies once a request), a watching
    watch ran its rounds back to back, 7,000 questions a second instead of its 500 (bench/results/cpu/2026-12-08)."""
    items = [f"item-{i}" for i in range(100)]
    asked = []
    watch = StreamWatch("test-watch", 0.1, open_items=lambda: list(items),
                        is_cancelled=lambda item: asked.append(time.monotonic()) or False,
                        on_cancelled=lambda item: None, max_questions_per_s=500)  # 50 a round
    watch.start()
    try:
        time.sleep(0.15)  # the first round began
        start, count = time.monotonic(), len(asked)
        while time.monotonic() < start + 1.0:
            watch.notify()  # a new request every 2 ms
            time.sleep(0.002)
        per_s = (len(asked) - count) / (time.monotonic() - start)
        assert 250 <= per_s <= 600, f"{per_s:.0f} questions a second, budget 500"
    finally:
        watch.stop()


def test_an_idle_watch_is_woken_by_what_is_opened_at_once():
    items: list[str] = []
    asked = []
    watch = StreamWatch("test-watch", 0.05, open_items=lambda: list(items),
                        is_cancelled=lambda item: asked.append(time.monotonic()) or False,
                        on_cancelled=lambda item: None)
    watch.start()
    try:
        time.sleep(0.1)  # idle: waiting up to IDLE_UNLOAD_CHECK_S (0.5 s) for something to be opened
        opened = time.monotonic()
        items.append("a")
        watch.notify()
        deadline = opened + 0.4
        while not asked and time.monotonic() < deadline:
            time.sleep(0.005)
        assert asked and asked[0] - opened < 0.3, "an idle watch waited for its idle look instead of the notify"
    finally:
        watch.stop()
