"""What one response costs inside Triton's Python backend, with no model work around it.

    .venv/bin/python bench/send_cost.py [--responses 20000] [--rounds 3]

A decoupled Python model made for this run (written to a temporary repository, served by `trtllm-triton serve`)
answers one request with `--responses` responses in a tight loop on one thread, each carrying the `--outputs`
tensors (`output_ids` and `sequence_length` INT32 [1, 1], `text_output` one BYTES word), then a final one. It times
each part with the thread's CPU clock and the wall clock: building the pb_utils.Tensor objects and the
InferenceResponse, `response_sender.send`, and `request.is_cancelled()` (asked as often, in a loop of its own). The client (one gRPC stream) receives every response; tritonserver's CPU over the loop
comes from outside (psutil). Printed a round: microseconds a response of the sending thread's CPU and wall in each
part, the stub process's CPU over the send loop (every thread), and tritonserver's CPU a response over the whole
request (its gRPC frontend, the backend's side of the IPC).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR.parent / "tests")]

from conftest import start_server  # noqa: E402
from triton_client import as_inputs  # noqa: E402

CONFIG = """name: "send_cost"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "count" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "outputs" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] },
         { name: "sequence_length" data_type: TYPE_INT32 dims: [ -1, -1 ] },
         { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "stats" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MODEL = '''
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._answer, args=(request,), daemon=True).start()
        return None

    def _answer(self, request):
        count = int(pb_utils.get_input_tensor_by_name(request, "count").as_numpy()[0])
        names = pb_utils.get_input_tensor_by_name(request, "outputs").as_numpy()[0].decode().split(",")
        arrays = {"output_ids": np.array([[7]], dtype=np.int32), "sequence_length": np.array([[1]], dtype=np.int32),
                  "text_output": np.array([b" word"], dtype=np.object_)}
        outputs = [(name, arrays[name]) for name in names if name]
        sender = request.get_response_sender()
        cpu, wall = time.thread_time_ns, time.perf_counter_ns
        spent = {"build_cpu": 0, "build_wall": 0, "send_cpu": 0, "send_wall": 0}
        process0 = time.process_time_ns()
        for _ in range(count):
            c0, w0 = cpu(), wall()
            tensors = [pb_utils.Tensor(name, array) for name, array in outputs]
            response = pb_utils.InferenceResponse(output_tensors=tensors)
            c1, w1 = cpu(), wall()
            sender.send(response)
            c2, w2 = cpu(), wall()
            spent["build_cpu"] += c1 - c0
            spent["build_wall"] += w1 - w0
            spent["send_cpu"] += c2 - c1
            spent["send_wall"] += w2 - w1
        spent["stub_process_cpu"] = time.process_time_ns() - process0
        c0, w0 = cpu(), wall()
        for _ in range(count):
            request.is_cancelled()
        spent["is_cancelled_cpu"], spent["is_cancelled_wall"] = cpu() - c0, wall() - w0
        stats = np.array([json.dumps(spent).encode()], dtype=np.object_)
        sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("stats", stats)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def one_round(url: str, server_pid: int, count: int, outputs: str) -> dict[str, float]:
    done, stats, received = threading.Event(), {}, [0]

    def on_response(result, error) -> None:
        if error is not None:
            stats["error"] = str(error)
            done.set()
            return
        out = result.as_numpy("stats")
        if out is not None:
            stats.update(json.loads(out[0]))
            done.set()
        else:
            received[0] += 1

    tritonserver = next(p for p in psutil.Process(server_pid).children(recursive=True) if p.name() == "tritonserver")
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=on_response)
    cpu0 = sum(tritonserver.cpu_times()[:2])
    client.async_stream_infer("send_cost", as_inputs({"count": np.array([count], dtype=np.int32),
                                                      "outputs": np.array([outputs.encode()], dtype=np.object_)}))
    done.wait(300)
    cpu1 = sum(tritonserver.cpu_times()[:2])
    client.stop_stream()
    client.close()
    if "error" in stats:
        raise RuntimeError(stats["error"])
    per = {name: value / count / 1000.0 for name, value in stats.items()}
    per["tritonserver_cpu"] = (cpu1 - cpu0) * 1e6 / count

    per["received"] = received[0]
    return per


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responses", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--outputs", nargs="+", default=["output_ids", "output_ids,sequence_length", "text_output"],
                        help="the tensors a response carries, comma-separated; each choice is measured in turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="send-cost-") as tmp:
        repository = Path(tmp) / "repository"
        (repository / "send_cost" / "1").mkdir(parents=True)
        (repository / "send_cost" / "config.pbtxt").write_text(CONFIG)
        (repository / "send_cost" / "1" / "model.py").write_text(MODEL)
        server = start_server(Path(tmp) / "server", executor=None, repository=repository, models=("send_cost",))
        try:
            rounds: dict[str, list[dict[str, float]]] = {outputs: [] for outputs in args.outputs}
            for number in range(args.rounds):  # the choices take turns, so the machine's drift falls on each
                for outputs in args.outputs:
                    per = one_round(server.grpc_url, server.process.pid, args.responses, outputs)
                    rounds[outputs].append(per)
                    print(f"round {number + 1} [{outputs}]: " + ", ".join(f"{k} {v:.1f}" for k, v in per.items()),
                          flush=True)
        finally:
            server.stop()
    for outputs, runs in rounds.items():
        keys = [k for k in runs[0] if k != "received"]
        print(f"[{outputs}] median us a response (min-max): " + ", ".join(
            f"{k} {statistics.median(r[k] for r in runs):.1f} ({min(r[k] for r in runs):.1f}-"
            f"{max(r[k] for r in runs):.1f})" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
