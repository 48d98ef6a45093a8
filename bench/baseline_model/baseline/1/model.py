"""The benchmark's baseline: a deliberately naive decoupled model, shaped like NVIDIA's Python `tensorrt_llm`
model (tensorrtllm_backend, inflight_batcher_llm), over the project's synthetic executor.

What it copies on purpose (see /work/shared/reference/nvidia_triton_interface.md, "Known weaknesses"):
  - one awaiter thread polls the executor with a 1 ms timeout and sends every step as its own response, from
    that same thread (one IPC round trip per token; nothing is coalesced);
  - every response builds fresh numpy arrays and pb_utils tensors;
  - a cancellation thread calls `is_cancelled()` on every active request each `cancellation_check_period_ms`,
    holding the lock the awaiter needs;
  - a stats thread sets gauge metrics from the executor's iteration stats each `stats_check_period_ms`.
It is not used by the product; only bench/serving.py loads it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.synthetic import SyntheticExecutor

if os.environ.get("BENCH_DIR"):  # bench/serving.py counts generated tokens in every model it measures
    sys.path.insert(0, os.environ["BENCH_DIR"])
    from counted import count_generated
else:  # pragma: no cover - loaded outside the benchmark

    def count_generated(executor):
        return None


def _param(config: dict, key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value or default


def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.executor = SyntheticExecutor(
            step_ms=float(_param(config, "synthetic_step_ms", "10")),
            max_batch_size=int(_param(config, "max_batch_size", "64")),
        )
        count_generated(self.executor)
        self.cancellation_check_period_ms = int(_param(config, "cancellation_check_period_ms", "100"))
        self.stats_check_period_ms = int(_param(config, "stats_check_period_ms", "100"))
        self.lock = threading.Lock()
        self.req_id_to_request = {}  # executor id -> (triton request, response sender)
        self.running = True
        family = pb_utils.MetricFamily(
            name="nv_trt_llm_request_metrics", description="TRT LLM request metrics", kind=pb_utils.MetricFamily.GAUGE
        )
        self.metric_family = family  # keep alive as long as its metrics
        self.gauges = {kind: family.Metric(labels={"request_type": kind, "model": "baseline", "version": "1"})
                       for kind in ("active", "max", "scheduled", "waiting")}
        general = pb_utils.MetricFamily(
            name="nv_trt_llm_general_metrics", description="General TRT LLM metrics", kind=pb_utils.MetricFamily.GAUGE
        )
        self.general_family = general
        self.iteration_gauge = general.Metric(labels={"general_type": "iteration_counter", "model": "baseline", "version": "1"})
        self.threads = [
            threading.Thread(target=self.awaiter_loop, daemon=True),
            threading.Thread(target=self.cancellation_loop, daemon=True),
            threading.Thread(target=self.metrics_loop, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            input_ids = _input(request, "input_ids")
            max_tokens = _input(request, "request_output_len")
            streaming = _input(request, "streaming")
            end_id = _input(request, "end_id")
            generation = GenerationRequest(
                input_ids=[int(t) for t in input_ids.reshape(-1)],
                max_tokens=int(max_tokens.reshape(-1)[0]),
                streaming=True if streaming is None else bool(streaming.reshape(-1)[0]),
                end_id=None if end_id is None else int(end_id.reshape(-1)[0]),
            )
            with self.lock:
                req_id = self.executor.enqueue(generation)
                self.req_id_to_request[req_id] = (request, sender)
        return None

    def awaiter_loop(self) -> None:
        while self.running:
            for step in self.executor.await_steps(0.001):
                with self.lock:
                    if step.request_id not in self.req_id_to_request:
                        continue
                    _, sender = self.req_id_to_request[step.request_id]
                    if step.is_final:
                        # Forget it before the final send: is_cancelled() on a request whose final response is
                        # out crashes tritonserver 2.51 (TRITONBACKEND_ResponseFactoryIsCancelled, seen here).
                        del self.req_id_to_request[step.request_id]
                if step.error:
                    response = pb_utils.InferenceResponse(error=pb_utils.TritonError(step.error))
                else:
                    tokens = np.array([[step.token_ids]], dtype=np.int32).reshape(1, 1, -1)
                    response = pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("output_ids", tokens),
                        pb_utils.Tensor("sequence_length", np.array([[tokens.shape[-1]]], dtype=np.int32)),
                    ])
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if step.is_final else 0)

    def cancellation_loop(self) -> None:
        while self.running:
            time.sleep(self.cancellation_check_period_ms / 1000.0)
            with self.lock:
                for req_id, (request, _) in self.req_id_to_request.items():
                    if request.is_cancelled():
                        self.executor.cancel(req_id)

    def metrics_loop(self) -> None:
        while self.running:
            time.sleep(self.stats_check_period_ms / 1000.0)
            for stats in self.executor.iteration_stats()[-1:]:
                self.gauges["active"].set(stats.active_requests)
                self.gauges["max"].set(stats.max_active_requests)
                self.gauges["scheduled"].set(stats.scheduled_requests or 0)
                self.gauges["waiting"].set(stats.queued_requests)
                self.iteration_gauge.set(stats.iteration)

    def finalize(self) -> None:
        self.running = False
        self.executor.shutdown()
