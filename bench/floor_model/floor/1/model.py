"""The benchmark's floor: the least a decoupled Python model can do with the project's synthetic executor.

execute() enqueues each request's `input_ids` and keeps its response sender; one thread blocks in
`await_steps` and sends every step from that thread, the final flag on the last. No validation, no metrics, no
cancellation, no coalescing: not a model to serve with. Time to first token through it is what Triton, the
Python backend's IPC and the gRPC client cost on their own; `bench/ttft.py --compare ... floor=floor` sets it
beside ours.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.executors.synthetic import SyntheticExecutor

if os.environ.get("BENCH_DIR"):  # the benchmarks count generated tokens in every model they measure
    sys.path.insert(0, os.environ["BENCH_DIR"])
    from counted import count_generated
else:  # pragma: no cover - loaded outside the benchmark

    def count_generated(executor):
        return None


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        parameters = json.loads(args["model_config"]).get("parameters", {})
        step_ms = float(parameters.get("synthetic_step_ms", {}).get("string_value") or 10)
        self.executor = SyntheticExecutor(step_ms=step_ms, max_batch_size=512)
        count_generated(self.executor)
        self.senders: dict[int, object] = {}
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._await_and_send, daemon=True)
        self.thread.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1).tolist()
            max_tokens = int(pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().reshape(-1)[0])
            with self.lock:  # registered before the executor can return a step for it
                request_id = self.executor.enqueue(GenerationRequest(input_ids=ids, max_tokens=max_tokens, streaming=True))
                self.senders[request_id] = request.get_response_sender()
        return None

    def _await_and_send(self) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        while self.running:
            for step in self.executor.await_steps(0.1):
                with self.lock:
                    sender = self.senders.pop(step.request_id) if step.is_final else self.senders.get(step.request_id)
                if sender is None:
                    continue
                outputs = [
                    pb_utils.Tensor("output_ids", np.array(step.token_ids, dtype=np.int32).reshape(1, 1, -1)),
                    pb_utils.Tensor("sequence_length", np.array([[len(step.token_ids)]], dtype=np.int32)),
                ]
                try:
                    sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=final if step.is_final else 0)
                except Exception:  # client gone: the request's later steps are dropped
                    self.executor.cancel(step.request_id)

    def finalize(self) -> None:
        self.running = False
        self.executor.shutdown()
        self.thread.join(timeout=5)
