"""NVIDIA's perf_analyzer as an independent client, in its own virtualenv (bench/.perf-venv, gitignored).

    .venv/bin/python bench/perf_analyzer.py --setup                      # create the venv, nothing else
    .venv/bin/python bench/perf_analyzer.py --url 127.0.0.1:8001 --model tensorrt_llm --concurrency 256

The venv holds tritonclient[all]==2.48.0 (which ships the perf_analyzer binary), matplotlib (for the plot)
and py-spy (for profiling). perf_analyzer needs libb64.so.0d (Debian's libb64-0d; if it is not installed, the
copy nvidia-pytriton carries) and a libcudart.so.12 (nvidia_pytriton.libs carries one under a hashed name):
both are symlinked into bench/.perf-venv/perf-libs, which goes first on LD_LIBRARY_PATH.

Requests are token-level `input_ids` + `request_output_len` + `streaming`, sent with `--streaming` over gRPC
in perf_analyzer's closed loop (`--concurrency-range`): every request delivers exactly `tokens` tokens, so
delivered tokens/s = completed requests/s x tokens. perf_analyzer says that for a decoupled model it measures
latency to the first response; with 1-token requests at concurrency 1 that is time to first token.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
VENV = BENCH_DIR / ".perf-venv"
LIBS = VENV / "perf-libs"
PACKAGES = ["tritonclient[all]==2.48.0", "matplotlib==3.11.2", "py-spy==0.4.3"]


def ensure_venv() -> Path:
    """Create bench/.perf-venv once; returns its python."""
    python = VENV / "bin" / "python"
    if not (VENV / "bin" / "perf_analyzer").exists() or not (VENV / "bin" / "py-spy").exists():
        subprocess.run(["python3", "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PACKAGES], check=True)
    _link_libraries()
    return python


def _pytriton_libs() -> Path:
    sys.path.insert(0, str(BENCH_DIR.parent))
    from trtllm_model.server import pytriton_libs_dir

    return pytriton_libs_dir()


def _link_libraries() -> None:
    LIBS.mkdir(parents=True, exist_ok=True)
    libs = _pytriton_libs()
    debian_b64 = Path("/usr/lib/x86_64-linux-gnu/libb64.so.0d")
    sources = {
        "libb64.so.0d": debian_b64 if debian_b64.exists() else next(libs.glob("libb64-*.so.0d")),
        "libcudart.so.12": next(libs.glob("libcudart-*.so.12*")),
    }
    for name, source in sources.items():
        link = LIBS / name
        if link.is_symlink() or link.exists():
            if link.resolve() == source.resolve():
                continue
            link.unlink()
        link.symlink_to(source)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(LIBS), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def input_data(path: Path, tokens: int) -> Path:
    data = {"data": [{
        "input_ids": {"content": [7, 11], "shape": [2]},
        "request_output_len": {"content": [tokens], "shape": [1]},
        "streaming": {"content": [True], "shape": [1]},
    }]}
    path.write_text(json.dumps(data))
    return path


def run(url: str, model: str, concurrency: int, tokens: int, timeout_s: float = 300) -> dict:
    """Run perf_analyzer once; returns its numbers (requests/s, responses/s, tokens/s, latencies) or an error."""
    ensure_venv()
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        command = [
            str(VENV / "bin" / "perf_analyzer"), "-m", model, "-i", "grpc", "-u", url, "--streaming",
            f"--concurrency-range={concurrency}", f"--input-data={input_data(work / 'input.json', tokens)}",
            # count_windows: a window ends after `concurrency` requests complete, so a slow model (the naive
            # baseline needs tens of seconds per window) is measured instead of refused; any 3 windows count.
            "--measurement-mode=count_windows", f"--measurement-request-count={max(concurrency, 50)}",
            "--stability-percentage=1000", "--max-trials=3", "--percentile=50", f"-f={work / 'out.csv'}",
        ]
        try:
            done = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            return {"error": f"perf_analyzer timed out after {timeout_s} s", "output": (exc.stdout or "")[-2000:]}
        output = done.stdout + done.stderr
        result = {"command": " ".join(command[:1] + [c for c in command[1:] if not c.startswith(("--input-data", "-f="))]),
                  "returncode": done.returncode, "concurrency": concurrency, "tokens_per_request": tokens}
        throughput = re.search(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec, latency (\d+) usec", output)
        responses = re.findall(r"Response [Tt]hroughput: ([\d.]+)", output)
        if throughput is None:
            result["error"] = "no throughput line in perf_analyzer's output"
            result["output"] = output[-3000:]
            return result
        requests_per_s = float(throughput.group(1))
        result.update(
            requests_per_s=requests_per_s,
            tokens_per_s=requests_per_s * tokens,
            latency_p50_ms=int(throughput.group(2)) / 1000.0,
            responses_per_s=float(responses[-1]) if responses else None,
            output=output[-1500:],
        )
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="only create the virtualenv")
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--model", default="tensorrt_llm")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    if args.setup:
        print(ensure_venv())
        return 0
    print(json.dumps(run(args.url, args.model, args.concurrency, args.tokens), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
