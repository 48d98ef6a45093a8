"""Stream watches: whose client cancelled, and whether the model is still served. Shared by `tensorrt_llm`'s
poller and the `ensemble` model; no Triton objects here (the models pass in how to ask).

Both questions are IPC or HTTP round trips, so they are asked in bulk on one thread, never on the token path,
and never while holding a lock that `execute()` or a delivery needs.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 1.0

# Cancellation questions asked per second at most, over all open items. Each is an IPC round trip on the stub's one
# channel to the server, the channel every response `send` needs too: on the H200 at 256 streams a question per
# stream every 100 ms (2,560 a second) left the sends about 770 a second. Up to `MAX_QUESTIONS_PER_S * period_s`
# open items each are still asked every period; beyond that they are asked in turn, oldest first, so one item's
# wait between questions grows to items / MAX_QUESTIONS_PER_S (0.5 s at 256 streams).
MAX_QUESTIONS_PER_S = 500

Item = TypeVar("Item")


# How often a watch with nothing open asks whether its model is being unloaded.
IDLE_UNLOAD_CHECK_S = 0.5


class UnloadProbe:
    """Whether the server confirms that `model` is being unloaded or that it is stopping, asked over its HTTP address.

    Confirmed means: the model was seen ready, and now the server answers its readiness with a non-200 status (a
    model being unloaded), or the address refuses connections (tritonserver closes its endpoints first when it stops).
    Before the model is first seen ready it is loading (an idle instance asks from the start, while tritonserver still
    loads the other models and `serve`'s guard answers 503 for it): nothing is an unload then.
    Plain http.client to the address `trtllm-triton serve` gave, so no proxy from the environment answers for the
    server. Anything else (a timeout, a reset, an address that never answered) is not an unload: a model that
    stopped serving on a network hiccup would fail every stream while Triton kept sending it traffic."""

    def __init__(self, base_url: str, model: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        url = urllib.parse.urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.path = f"{url.path.rstrip('/')}/v2/models/{urllib.parse.quote(model)}/ready"
        self.timeout_s = timeout_s
        self.seen_ready = False  # the server answered 200 for the model at least once

    def __call__(self) -> bool:
        # A new connection each time: a stop shows only as a listener that refuses them.
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            connection.request("GET", self.path)
            status = connection.getresponse().status
        except ConnectionRefusedError:
            if not self.seen_ready:
                log.debug("readiness address %s:%d refuses connections before the model was ready", self.host, self.port)
            return self.seen_ready
        except (OSError, http.client.HTTPException) as exc:
            log.debug("readiness unknown: %s", exc)
            return False
        finally:
            connection.close()
        if status == 200:
            self.seen_ready = True
        return status != 200 and self.seen_ready


class StreamWatch(Generic[Item]):
    """One thread that, every `period_s` while anything is open, first asks whether the model is being unloaded
    (then `on_unload()` once, and nothing more is asked), else asks open items whether their client cancelled
    (then `on_cancelled(item)`): all of them while they fit `max_questions_per_s`, else the next ones in turn.

    `open_items()` returns a snapshot (taken under the caller's own lock, released before any question);
    `is_cancelled(item)` returns None when the item ended meanwhile (it must not be asked about then: tritonserver
    2.51 crashes on a cancellation query after a request's final response)."""

    def __init__(
        self,
        name: str,
        period_s: float,
        open_items: Callable[[], Iterable[Item]],
        is_cancelled: Callable[[Item], bool | None],
        on_cancelled: Callable[[Item], None],
        unloading: Callable[[], bool] | None = None,
        on_unload: Callable[[], None] | None = None,
        max_questions_per_s: float = MAX_QUESTIONS_PER_S,
    ) -> None:
        self.period_s = period_s
        self.questions_per_round = max(1, int(max_questions_per_s * period_s))
        self._next = 0  # where the next round's questions start in the open items (oldest first)
        self._open_items = open_items
        self._is_cancelled = is_cancelled
        self._on_cancelled = on_cancelled
        self._unloading = unloading
        self._on_unload = on_unload
        self.unload_seen = False
        self._wake = threading.Condition()
        self._idle = False  # waiting for something to be opened (notify() wakes it only then)
        self._running = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        """Something was opened: an idle watch starts watching again. A watch that is watching is left alone (no
        lock, no wake): woken by every new request, its rounds ran back to back, past `max_questions_per_s` (7,400
        questions a second instead of 500 at 128 open items and 620 new ones a second, bench/results/cpu/2026-12-08).
        Read without the lock: the watch sets `_idle` before it takes its last snapshot, and an opener registers
        its item before it calls this, so either the snapshot has the item or this sees the watch idle."""
        if not self._idle:
            return
        with self._wake:
            self._wake.notify()

    def stop(self, timeout_s: float = 2.0) -> None:
        with self._wake:
            self._running = False
            self._wake.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        woken = True  # items appeared since the last round (or the watch just started)
        while self._running:
            items = list(self._open_items())
            if not items:
                woken = True
                with self._wake:
                    self._idle = True
                    if self._running and not list(self._open_items()):
                        self._wake.wait(IDLE_UNLOAD_CHECK_S)  # nothing in flight: until notify() (or stop), or a look
                    self._idle = False
                # An idle instance sees an unload too, and releases its executor: a stop waits for every instance's
                # release (launch/cli.py, held_by_triton_only), and Triton may never finalize a model a client holds.
                # Only over HTTP: the stub's own readiness query now and then crashes a server that stops by itself.
                if (self._running and not self.unload_seen and isinstance(self._unloading, UnloadProbe)
                        and not list(self._open_items())):
                    self._check_unloading()
                continue
            if woken:
                # Readiness at once when requests arrive at an idle watch: the model is serving them, so an
                # UnloadProbe sees it ready now, and an unload that follows within a period is told from a load.
                woken = False
                if self._check_unloading():
                    continue
            # A period first: a request that just arrived has not been cancelled yet, and asking (a round trip
            # each) while its first step is starting would only compete with it.
            deadline = time.monotonic() + self.period_s
            with self._wake:  # a whole period: only stop() ends it early
                while self._running and (left := deadline - time.monotonic()) > 0:
                    self._wake.wait(left)
            if not self._running:
                return
            if self._check_unloading():
                continue
            for item in self._this_rounds(items):
                try:
                    cancelled = self._is_cancelled(item)
                except Exception:
                    log.debug("is_cancelled failed", exc_info=True)
                    continue
                if cancelled:
                    self._on_cancelled(item)

    def _this_rounds(self, items: list[Item]) -> list[Item]:
        """The items to ask this round: all, or the next `questions_per_round` of them after the last round's."""
        if len(items) <= self.questions_per_round:
            return items
        start = self._next % len(items)
        chosen = (items[start:] + items[:start])[: self.questions_per_round]
        self._next = start + self.questions_per_round
        return chosen

    def _check_unloading(self) -> bool:
        # Readiness before cancellations: once the model is being unloaded, asking Triton about a request can hang
        # (one forwarded by an `ensemble` that is already gone), and the streams must still be ended.
        if self.unload_seen:
            if self._on_unload is not None:
                self._on_unload()  # idempotent: ends what is still open
            return True
        if self._unloading is None:
            return False
        try:
            unloading = self._unloading()
        except Exception:
            log.debug("unload check failed", exc_info=True)
            return False  # an error is not an unload
        if not unloading:
            return False
        self.unload_seen = True
        if self._on_unload is not None:
            self._on_unload()
        return True

