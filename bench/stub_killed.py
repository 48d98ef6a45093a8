"""A stub killed while serving: how soon the model answers not ready and its streams end.

    .venv/bin/python bench/stub_killed.py [--runs 3]

Each run starts `trtllm-triton serve` (synthetic executor, one instance of `tensorrt_llm`), opens 3 long streams on
one gRPC call, SIGKILLs the stub of `tensorrt_llm_0_0`, and prints the seconds until /v2/models/tensorrt_llm/ready
stops answering 200, until the streams' gRPC call ends (and its status), and until `serve` exits (and its code).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import psutil  # noqa: E402
from conftest import start_server  # noqa: E402
from triton_client import StreamClient, token_inputs, wait_until_streaming  # noqa: E402


def one_run(workdir: Path) -> str:
    server = start_server(workdir, new_session=True)
    try:
        (stub,) = [p for p in psutil.Process(server.process.pid).children(recursive=True)
                   if "tensorrt_llm_0_0" in p.cmdline()]
        client = StreamClient(server.grpc_url)
        streams = [client.send("tensorrt_llm", token_inputs([i], 4000), f"s{i}") for i in range(3)]
        wait_until_streaming(streams, 30)
        killed_at = time.monotonic()
        stub.kill()
        not_ready = None
        while not client.call_ended.wait(0.05):
            if not_ready is None:
                try:
                    urllib.request.urlopen(f"{server.http_url}/v2/models/tensorrt_llm/ready", timeout=1).close()
                except OSError:
                    not_ready = time.monotonic() - killed_at
        ended = time.monotonic() - killed_at
        code = server.process.wait(60)
        return (f"not ready after {not_ready if not_ready is not None else ended:.1f} s, streams' call ended "
                f"({client.call_code.name if client.call_code else 'closed'}) after {ended:.1f} s, serve exit {code} "
                f"after {time.monotonic() - killed_at:.1f} s")
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stub-killed-") as root:
        for run in range(args.runs):
            print(f"run {run}: {one_run(Path(root) / f'run{run}')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
