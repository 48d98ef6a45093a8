"""Time to first token at one stream, taken apart: where the time between a request and its first token goes.

    .venv/bin/python bench/ttft.py                                     # phases of one server's TTFT
    .venv/bin/python bench/ttft.py --compare before=HEAD~1 after=.     # interleaved A/B of source trees

Phases: starts a server (synthetic executor, 10 ms steps, only `tensorrt_llm` loaded) with Triton's own trace at
TIMESTAMPS level for every request and bench/traced_model.py as the model (the product plus timestamps), sends
`--requests` 1-token requests one after another on one gRPC stream (asyncio, `--pause-ms` between them, 0 by
default: bench/serving.py's probe) and prints, for each event on the way, the median time since the client sent
the request, and the median of each step between consecutive events. Every clock is CLOCK_MONOTONIC, shared by
the three processes.

Compare: starts one server per source tree at once (a revision is checked out with `git worktree`; `.` is this
tree; `floor` is bench/floor_model, the least a Python model can do with the same executor) and alternates
requests between them, so every tree sees the same minutes of a noisy machine; prints each tree's TTFT p50 and
quartiles. The in-process executor is measured in the same run for reference.

    .venv/bin/python bench/ttft.py --compare before=f53aa41 after=. floor=floor
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(BENCH_DIR))
import grpc  # noqa: E402
from aio_client import _request  # noqa: E402
from conftest import start_server, write_repository  # noqa: E402
from serving import in_process_ttft  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

PARAMETERS = {"max_batch_size": "64", "synthetic_step_ms": "10"}
TRITON_EVENTS = ("GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                 "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END")


async def probe(urls: list[str], requests: int, pause_s: float) -> list[dict[str, tuple[int, int]]]:
    """1-token requests, one after another, alternating over `urls`: per server, request id -> (sent, first) ns."""
    calls = []
    for url in urls:
        channel = grpc.aio.insecure_channel(url)
        await channel.channel_ready()
        calls.append(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer())
    timings: list[dict[str, tuple[int, int]]] = [{} for _ in urls]
    for number in range(requests):
        for index, call in enumerate(calls):
            request_id = f"ttft-{number}"
            request = _request("tensorrt_llm", request_id, (number * 31 + 5) % 32000, 1)
            sent = time.monotonic_ns()
            await call.write(request)
            first = 0
            while True:
                message = await call.read()
                first = first or time.monotonic_ns()
                if message.error_message:
                    raise RuntimeError(message.error_message)
                if message.infer_response.parameters["triton_final_response"].bool_param:
                    break
            timings[index][request_id] = (sent, first)
            await asyncio.sleep(pause_s)
    for call in calls:
        call.cancel()
    return timings


def start(workdir: Path, source: Path | None, traced: bool, server_args: list[str]):
    """Our model from `source`, or (source None) the floor model under our model's name."""
    if source is None:
        repository = workdir / "repository"
        shutil.copytree(BENCH_DIR / "floor_model" / "floor", repository / "tensorrt_llm",
                        ignore=shutil.ignore_patterns("__pycache__"))
        config = repository / "tensorrt_llm" / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "floor"', 'name: "tensorrt_llm"'))
        return start_server(workdir, executor=None, repository=repository, env={"BENCH_DIR": str(BENCH_DIR)})
    repository = write_repository(workdir / "repository", PARAMETERS, models=("tensorrt_llm",))
    env = {"PYTHONPATH": str(source)}
    if traced:
        shutil.copy(BENCH_DIR / "traced_model.py", repository / "tensorrt_llm" / "1" / "model.py")
        env["BENCH_TRACE_FILE"] = str(workdir / "model-events.json")
    # The server runs from the source tree, so the stub imports that tree's trtllm_model.
    return start_server(workdir, executor="synthetic", repository=repository, env=env, server_args=server_args,
                        cwd=source)


def phases(workdir: Path, timings: dict[str, tuple[int, int]], skip: int) -> list[tuple[str, float]]:
    """(event, median µs since the client sent the request) in path order."""
    triton: dict[str, dict[str, int]] = defaultdict(dict)
    ids = {}
    for entry in json.loads((workdir / "triton-trace.json").read_text()):
        if "request_id" in entry:
            ids[entry["id"]] = entry["request_id"]
        for stamp in entry.get("timestamps", []):
            triton[entry["id"]].setdefault(stamp["name"], stamp["ns"])
    by_request = {ids[i]: stamps for i, stamps in triton.items() if i in ids}
    events = json.loads((workdir / "model-events.json").read_text())
    steps = [t for name, _, t in events if name == "engine_step"]
    executor_id, model = {}, defaultdict(dict)
    last_request = None
    for name, key, t in events:
        if name == "execute":
            last_request = key
            model[key]["execute() called"] = t
        elif name == "enqueued" and last_request is not None:
            executor_id[key] = last_request
            model[last_request]["enqueued"] = t
            after = bisect.bisect_left(steps, t)
            if after < len(steps):
                model[last_request]["engine step (10 ms pace)"] = steps[after]
        elif name == "steps_taken":
            for request_id in key:
                model[executor_id.get(request_id)].setdefault("step taken by a worker", t)
        elif name in ("deliver_start", "deliver_end") and key in executor_id:
            model[executor_id[key]].setdefault(name.replace("_", " "), t)
        elif name in ("send_start", "send_end") and last_request is not None:
            model[last_request].setdefault(f"send() {name[5:]}", t)
    rows: dict[str, list[float]] = defaultdict(list)
    for request_id, (sent, first) in list(timings.items())[skip:]:
        stamps = {**{k: v for k, v in by_request.get(request_id, {}).items() if k in TRITON_EVENTS}, **model[request_id],
                  "client got the token": first}
        for name, t in stamps.items():
            rows[name].append((t - sent) / 1000.0)
    return sorted(((name, statistics.median(values)) for name, values in rows.items()), key=lambda row: row[1])


def checkout(label: str, revision: str, workroot: Path) -> Path | None:
    if revision == "floor":
        return None
    if revision == ".":
        return ROOT
    path = workroot / f"tree-{label}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), revision], check=True,
                   capture_output=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--pause-ms", type=float, default=0.0, help="between requests (the in-process reference too)")
    parser.add_argument("--compare", nargs="+", metavar="LABEL=REVISION", help="git revisions (or .) to compare")
    args = parser.parse_args()
    skip = 20  # the first requests warm the path up
    inproc = statistics.median(in_process_ttft(10.0, 200, args.pause_ms / 1000.0)) * 1000
    print(f"in-process SyntheticExecutor TTFT p50 {inproc:.2f} ms", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-ttft-") as tmp:
        workroot = Path(tmp)
        if not args.compare:
            workdir = workroot / "server"
            trace = ["--trace-config=level=TIMESTAMPS", "--trace-config=rate=1", "--trace-config=log_frequency=0",
                     f"--trace-config=triton,file={workdir / 'triton-trace.json'}"]
            server = start(workdir, ROOT, traced=True, server_args=trace)
            try:
                timings = asyncio.run(probe([server.grpc_url], args.requests, args.pause_ms / 1000.0))[0]
            finally:
                server.stop()
            previous = 0.0
            print(f"{'event (median over requests)':40s} {'since sent, us':>15s} {'step, us':>10s}")
            for name, at in phases(workdir, timings, skip):
                print(f"{name:40s} {at:15.0f} {at - previous:10.0f}")
                previous = at
            print(f"TTFT p50 {previous / 1000:.2f} ms: +{previous / 1000 - inproc:.2f} ms over in-process")
            return 0
        trees = [(label, checkout(label, revision, workroot)) for label, revision in
                 (item.split("=", 1) for item in args.compare)]
        servers = []
        try:
            for label, source in trees:
                servers.append(start(workroot / f"server-{label}", source, traced=False, server_args=[]))
            time.sleep(1)
            timings = asyncio.run(probe([s.grpc_url for s in servers], args.requests, args.pause_ms / 1000.0))
        finally:
            for server in servers:
                server.stop()
            for _label, source in trees:
                if source not in (None, ROOT):
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(source)], check=False)
        for (label, _), timing in zip(trees, timings):
            ttft = sorted((first - sent) / 1e6 for sent, first in list(timing.values())[skip:])
            p50 = statistics.median(ttft)
            print(f"{label:12s} TTFT p50 {p50:.3f} ms (+{p50 - inproc:.2f} over in-process)  p25 "
                  f"{ttft[len(ttft) // 4]:.3f}  p75 {ttft[3 * len(ttft) // 4]:.3f}  n={len(ttft)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
