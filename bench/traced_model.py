"""The project's `tensorrt_llm` model as bench/ttft.py loads it: unchanged, plus timestamps along the token path.

ttft.py copies this file over `tensorrt_llm/1/model.py` of a temporary repository. Each timestamp is
time.monotonic_ns (CLOCK_MONOTONIC, the clock Triton's trace and the client use too), kept in memory and written
to $BENCH_TRACE_FILE as JSON when the model is finalized. A few hundred nanoseconds per event.
"""

import json
import os
import time

from trtllm_model.triton import model as _model_module
from trtllm_model.triton.model import TritonPythonModel as _ProductModel

EVENTS: list[tuple[str, object, int]] = []


def _mark(name: str, key: object) -> None:
    EVENTS.append((name, key, time.monotonic_ns()))


class TritonPythonModel(_ProductModel):
    def initialize(self, args: dict) -> None:
        super().initialize(args)
        executor, poller = self.executor, self.poller
        inner_enqueue, inner_route, inner_deliver = executor.enqueue, poller._route, poller._deliver
        inner_step = getattr(executor, "_step", None)

        def enqueue(request):
            request_id = inner_enqueue(request)
            _mark("enqueued", request_id)
            return request_id

        def route(steps):
            _mark("steps_taken", [s.request_id for s in steps])
            return inner_route(steps)

        def deliver(ctx, work):
            _mark("deliver_start", ctx.executor_id)
            inner_deliver(ctx, work)
            _mark("deliver_end", ctx.executor_id)

        def step():
            _mark("engine_step", None)
            inner_step()

        executor.enqueue, poller._route, poller._deliver = enqueue, route, deliver
        if inner_step is not None:  # the synthetic engine: when its step ran
            executor._step = step
        inner_stream = _model_module.TritonStream

        class Stream(inner_stream):
            __slots__ = ()

            def send(self, outputs, final):
                _mark("send_start", None)
                super().send(outputs, final)
                _mark("send_end", None)

        _model_module.TritonStream = Stream

    def execute(self, requests: list) -> None:
        for request in requests:
            _mark("execute", request.request_id())
        return super().execute(requests)

    def finalize(self) -> None:
        super().finalize()
        with open(os.environ["BENCH_TRACE_FILE"], "w") as file:
            json.dump(EVENTS, file)
