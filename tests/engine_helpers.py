"""Helpers for tests that drive an executor directly (no server)."""

from __future__ import annotations

import time

from trtllm_model.executor_interface import Executor, GenerationRequest, Step


def run_all(executor: Executor, requests: list[GenerationRequest], timeout_s: float = 300.0) -> list[list[Step]]:
    """Enqueue every request; returns each one's steps (in order) once every one has its final step. Steps of
    other requests (ones an earlier test left behind) are skipped; a step after a request's final fails the test."""
    ids = [executor.enqueue(request) for request in requests]
    steps: dict[int, list[Step]] = {request_id: [] for request_id in ids}
    deadline = time.monotonic() + timeout_s
    while not all(s and s[-1].is_final for s in steps.values()):
        assert time.monotonic() < deadline, "requests did not finish in time"
        for step in executor.await_steps(1.0):
            if step.request_id in steps:
                assert not (steps[step.request_id] and steps[step.request_id][-1].is_final), "a step after the final"
                steps[step.request_id].append(step)
    return [steps[request_id] for request_id in ids]
