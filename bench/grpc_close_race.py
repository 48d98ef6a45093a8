"""Triton 2.51 holding a model after a gRPC stream is closed just as its last response is written.

    .venv/bin/python bench/grpc_close_race.py unload --close abrupt --rounds 40
    .venv/bin/python bench/grpc_close_race.py unload --close graceful --rounds 80
    .venv/bin/python bench/grpc_close_race.py stop --runs 3

`unload`: one server (synthetic executor); each round opens one stream with 3 long requests, unloads `tensorrt_llm`
(each request gets its final), closes the stream (`abrupt`: the channel at once, as a client that cancels;
`graceful`: half-close, wait for the call to end, then the channel) and waits 8 s for the model to become
UNAVAILABLE, then loads it again; stops at the first round whose model stays UNLOADING.
`stop`: per run, a fresh server, 60 streams of 3 short requests each closed abruptly right after their finals, then
SIGTERM to `serve`: its exit code, seconds, and whether it took the path for a model held by Triton alone
(launch/cli.py, held_by_triton_only) or ran into tritonserver's exit timeout.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import requests  # noqa: E402
from conftest import start_server  # noqa: E402
from triton_client import StreamClient, token_inputs  # noqa: E402


def close(client: StreamClient, how: str) -> None:
    client._requests.put(None)  # half-close
    if how == "graceful":
        client.call_ended.wait(10)
    client.channel.close()


def unload_rounds(how: str, rounds: int, workdir: Path) -> int:
    """Rounds until the model stayed UNLOADING (rounds when it never did)."""
    server = start_server(workdir, executor="synthetic", models=("tensorrt_llm",), parameters={"max_batch_size": "8"})
    base = f"http://127.0.0.1:{server.http_port}/v2/repository"
    try:
        for number in range(rounds):
            client = StreamClient(server.grpc_url)
            streams = [client.send("tensorrt_llm", token_inputs([1, 504, 3575 + i], 2000), f"t{i}") for i in range(3)]
            time.sleep(0.5)
            threading.Thread(target=requests.post, args=(f"{base}/models/tensorrt_llm/unload",),
                             kwargs={"json": {}, "headers": server.admin_headers, "timeout": 60}, daemon=True).start()
            for stream in streams:
                assert stream.done.wait(20), "a request got no final response"
            close(client, how)
            state, deadline = None, time.monotonic() + 8
            while time.monotonic() < deadline and state != "UNAVAILABLE":
                index = requests.post(f"{base}/index", json={}, headers=server.admin_headers, timeout=10).json()
                state = {model["name"]: model.get("state") for model in index}.get("tensorrt_llm")
                time.sleep(0.1)
            print(f"round {number}: {state}", flush=True)
            if state != "UNAVAILABLE":
                return number
            requests.post(f"{base}/models/tensorrt_llm/load", json={}, headers=server.admin_headers,
                          timeout=120).raise_for_status()
        return rounds
    finally:
        server.process.kill()
        server.process.wait()


def stop_run(number: int, workdir: Path) -> None:
    server = start_server(workdir, executor="synthetic", models=("tensorrt_llm",), new_session=True)
    for _ in range(60):
        client = StreamClient(server.grpc_url)
        streams = [client.send("tensorrt_llm", token_inputs([1, 504, 3575 + i], 3), f"t{i}") for i in range(3)]
        for stream in streams:
            stream.done.wait(20)
        close(client, "abrupt")
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(60)
    log = server.log()
    print(f"run {number}: exit {code} after {time.monotonic() - started:.1f} s; held by Triton alone: "
          f"{'ending tritonserver now' in log}; exit timeout: {'Exit timeout expired' in log}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["unload", "stop"])
    parser.add_argument("--close", choices=["abrupt", "graceful"], default="abrupt")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "unload":
            held_at = unload_rounds(args.close, args.rounds, Path(tmp))
            print(f"{args.close}: " + (f"model held after round {held_at}" if held_at < args.rounds
                                       else f"no model held in {args.rounds} rounds"))
        else:
            for number in range(args.runs):
                stop_run(number, Path(tmp) / str(number))


if __name__ == "__main__":
    main()
