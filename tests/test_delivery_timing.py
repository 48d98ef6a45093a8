"""The delivery timers: per-phase microseconds per response, and the execute() calls (wall against thread CPU)."""

from __future__ import annotations

import time

from trtllm_model.serving.delivery_timing import DeliveryTiming, breakdown_line


def test_execute_calls_are_counted_with_wall_and_thread_cpu():
    timing = DeliveryTiming(period_s=1.0)
    with timing.executing(3):
        time.sleep(0.05)  # waiting: wall, no CPU
    with timing.executing(5):
        deadline = time.thread_time() + 0.02
        while time.thread_time() < deadline:  # working: wall and CPU
            pass
    totals = timing.totals()
    assert (totals["execute_calls"], totals["execute_requests"]) == (2, 8)
    assert totals["execute_ns"] >= 70e6
    assert 20e6 <= totals["execute_cpu_ns"] < totals["execute_ns"] - 40e6
    line = breakdown_line(totals, 1.0)
    assert "execute: 2.0 calls/s, 4.0 requests a call" in line


def test_execute_is_not_timed_when_the_timers_are_off():
    timing = DeliveryTiming(period_s=0.0)
    with timing.executing(4):
        time.sleep(0.01)
    assert timing.totals()["execute_calls"] == 0


def test_an_execute_that_raises_is_counted():
    timing = DeliveryTiming(period_s=1.0)
    try:
        with timing.executing(2):
            raise RuntimeError("a bug in execute")
    except RuntimeError:
        pass
    assert timing.totals()["execute_calls"] == 1
