"""Which tritonserver flags make responses carry their output tensors on this host.

On the H200 host (2026-12-03) every response of the Python backend arrived over gRPC with its outputs declared
(name, shape) but no data, with the server's default flags, under numpy 1.26 and numpy 2.5 alike; on the CPU
machine the same code delivers every token. This starts a synthetic server once per candidate set of flags, sends a
token request over gRPC, a text request to the ensemble over gRPC and a token request over HTTP, and prints what
came back. The first flag set that delivers over gRPC is written to --write (for $TRITON_SERVER_ARGS).

    python bench/gpu/probe_outputs.py --write /tmp/server_args.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

CANDIDATES = [
    ("defaults", [], {}),
    ("no pinned pool", ["--pinned-memory-pool-byte-size=0"], {}),
    ("no pinned or CUDA pool", ["--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0"], {}),
    ("GPU hidden from the server (diagnostic only)", [], {"CUDA_VISIBLE_DEVICES": ""}),
]


def probe(label: str, flags: list[str], env: dict[str, str]) -> dict:
    import numpy as np
    from conftest import start_server
    from triton_client import stream_once, text_inputs, token_inputs

    outcome: dict = {"label": label, "flags": flags, "env": env}
    with tempfile.TemporaryDirectory() as workdir:
        server = start_server(Path(workdir), executor="synthetic", server_args=flags, env=env, ready_timeout_s=120)
        try:
            result = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([11, 12, 13], 4))
            try:
                outcome["grpc_tokens"] = result.tokens()
            except ValueError as exc:
                outcome["grpc_tokens"] = f"no data: {exc}"
            result = stream_once(server.grpc_url, "ensemble", text_inputs("hi", 3, return_num_output_tokens=(True, np.bool_)))
            try:
                outcome["grpc_text"] = result.text()
            except (ValueError, AttributeError, IndexError) as exc:
                outcome["grpc_text"] = f"no data: {exc}"
            body = json.dumps({"input_ids": [11, 12, 13], "request_output_len": 4}).encode()
            request = urllib.request.Request(f"{server.http_url}/v2/models/tensorrt_llm/generate", data=body, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    outcome["http"] = json.loads(response.read()).get("output_ids")
            except Exception as exc:  # noqa: BLE001 - reported
                outcome["http"] = f"error: {exc}"
        finally:
            server.stop(timeout_s=20)
            outcome["log_tail"] = server.log()[-1500:]
    outcome["grpc_ok"] = outcome["grpc_tokens"] == [14, 15, 16, 17] and outcome["grpc_text"] == "jkl"
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, help="file for the first working flag set (space-separated)")
    parser.add_argument("--results-dir", type=Path, default=None, help="also write probe_outputs.json there")
    args = parser.parse_args()
    outcomes = []
    chosen = None
    for label, flags, env in CANDIDATES:
        outcome = probe(label, flags, env)
        outcomes.append(outcome)
        print(f"{label:48s} gRPC tokens {outcome['grpc_tokens']!s:40.40s} gRPC text {outcome['grpc_text']!s:30.30s} "
              f"HTTP {outcome['http']!s:40.40s}", flush=True)
        if chosen is None and outcome["grpc_ok"] and not env:
            chosen = flags
            break
    if args.results_dir:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        (args.results_dir / "probe_outputs.json").write_text(json.dumps(outcomes, indent=2))
    if chosen is None:
        print("no flag set delivered outputs over gRPC", flush=True)
        return 1
    print(f"chosen tritonserver flags: {' '.join(chosen) or '(defaults)'}", flush=True)
    if args.write:
        args.write.write_text(" ".join(chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
