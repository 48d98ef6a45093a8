"""What guides whose grammars are large cost the server's memory (the CPU layout: the stub compiles and keeps them).

    .venv/bin/python bench/guide_memory.py [--guides 40]

Starts `trtllm-triton serve --executor transformers` with the project's parameters. Each guide is a 385-byte regex,
an alternation of 48 `[^X]{8}` classes behind a distinct run of `q`s: it passes the guide checks and compiles to
about 47.5 MiB in 1.5 s (xgrammar 0.2.8, SmolLM2's vocabulary). Sends `--guides` of them one after another (one
token each), then waits 5 s idle; prints the `tensorrt_llm` stub's resident memory before, at the end and idle
after, each request's outcome, and a small request's time to first response alone and right after.
"""

from __future__ import annotations

import argparse
import string
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import start_server  # noqa: E402
from triton_client import stream_once, token_inputs  # noqa: E402

ALTERNATION = "(" + "|".join(f"[^{c}]{{8}}" for c in string.ascii_letters[1:49]) + ")"


def big_guide(n: int) -> dict:
    return {"guided_decoding_guide_type": ([[b"regex"]], np.object_),
            "guided_decoding_guide": ([[("q" * (n + 1) + ALTERNATION).encode()]], np.object_)}


def stub_rss_mib(server_pid: int) -> float:
    stubs = [p for p in psutil.Process(server_pid).children(recursive=True)
             if "triton_python_backend_stub" in " ".join(p.cmdline()) and "tensorrt_llm" in " ".join(p.cmdline())]
    return sum(p.memory_info().rss for p in stubs) / 2**20


def first_response_s(url: str) -> float:
    started = time.monotonic()
    result = stream_once(url, "tensorrt_llm", token_inputs([1, 504, 3575], 2), timeout_s=120)
    assert not result.errors, result.errors
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--guides", type=int, default=40)
    args = parser.parse_args()
    server = start_server(Path(tempfile.mkdtemp(prefix="guide-memory-")), executor="transformers")
    try:
        url, pid = server.grpc_url, server.process.pid
        stream_once(url, "tensorrt_llm", token_inputs([1, 2, 3], 1, guided_decoding_guide_type=(
            [[b"regex"]], np.object_), guided_decoding_guide=([[b"[0-9]+"]], np.object_)), timeout_s=120)
        alone = first_response_s(url)
        before = stub_rss_mib(pid)
        outcomes: dict[str, int] = {}
        for n in range(args.guides):
            result = stream_once(url, "tensorrt_llm", token_inputs([1, 2, 3], 1, **big_guide(n)), timeout_s=300)
            outcome = result.errors[0].split(": ")[0] + (" (over its share)" if "one compiled guide" in result.errors[0]
                                                          else "") if result.errors else "served"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        end = stub_rss_mib(pid)
        after = first_response_s(url)
        time.sleep(5)
        idle = stub_rss_mib(pid)
        print(f"{args.guides} guides of {len(ALTERNATION) + 1}+ bytes: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
        print(f"tensorrt_llm stub RSS: before {before:.0f} MiB, after the guides {end:.0f} MiB (+{end - before:.0f}), "
              f"idle 5 s later {idle:.0f} MiB (+{idle - before:.0f})")
        print(f"small request's first response: alone {alone * 1000:.1f} ms, after the guides {after * 1000:.1f} ms")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
