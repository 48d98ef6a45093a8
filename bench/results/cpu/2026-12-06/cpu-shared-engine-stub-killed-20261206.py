# Two instances sharing one engine worker (fc6a3b1), CPU, SmolLM2: SIGKILL the stub that did not start the worker, then
# send one short request a second. Run from the repository root: .venv/bin/python bench/results/cpu/2026-12-06/cpu-shared-engine-stub-killed-20261206.py
import sys, time, signal, re, psutil
sys.path[:0] = ["/work/main/tests", "/work/main"]
from pathlib import Path
from conftest import start_server
from test_e2e_engine_process import engine_workers
from test_e2e_multi_instance import ONE_INSTANCE, TWO_INSTANCES
from triton_client import stream_once, token_inputs
import tritonclient.grpc as grpcclient
tmp = Path("/tmp/stubkill"); import shutil; shutil.rmtree(tmp, ignore_errors=True)
server = start_server(tmp, executor="transformers", parameters={"max_batch_size": "4", "engine_process": "true"},
                      config_edits={ONE_INSTANCE: TWO_INSTANCES}, new_session=True)
try:
    (worker,) = engine_workers(server)
    stubs = [p for p in psutil.Process(server.process.pid).children(recursive=True) if "triton_python_backend_stub" in " ".join(p.cmdline()) and "tensorrt_llm" in " ".join(p.cmdline())]
    print("stubs", [(p.pid, p.ppid()) for p in stubs], "worker", worker.pid, worker.ppid())
    victim = [p for p in stubs if p.pid != worker.ppid()][0]
    victim.kill(); print("killed", victim.pid)
    for i in range(30):
        time.sleep(1)
        r = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1, 504, 3575], 4), timeout_s=60)
        ready = grpcclient.InferenceServerClient(server.grpc_url).is_model_ready("tensorrt_llm")
        print(i, r.errors, len(r.tokens()), "ready", ready)
        if i > 8: break
    print([l for l in server.log().splitlines() if "stub" in l.lower() or "attach" in l][-15:])
    print("workers now", [w.pid for w in engine_workers(server) if w.status() != psutil.STATUS_ZOMBIE] if False else worker.is_running())
finally:
    server.stop()
