"""Wait until this replica holds no open request: the preStop hook of deploy/kubernetes/*/deployment.yaml.

    python3 deploy/drain.py --metrics-url=http://127.0.0.1:8002/metrics --min-wait=5 --timeout=120

Kubernetes runs preStop when a pod starts to terminate, while it removes the pod from the Service's endpoints. This
waits `--min-wait` seconds (time for that removal to reach kube-proxy and clients' DNS), then until the sum of
`nv_llm_open_requests` (requests accepted and not yet finished, every model) is 0, or `--timeout` seconds passed.
Kubernetes then sends SIGTERM and the server's own stop ends whatever is still open with a final response.

Standard library only: it runs inside the server's image, in any Python 3.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request

OPEN_REQUESTS = re.compile(r"^nv_llm_open_requests(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE)


def open_requests(metrics_url: str) -> float | None:
    """Open requests over every model, or None when the server does not answer (nothing left to wait for)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=2) as response:
            text = response.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return sum(float(value) for value in OPEN_REQUESTS.findall(text))


def drain(metrics_url: str, min_wait_s: float, timeout_s: float, poll_s: float = 0.5) -> float | None:
    """Wait as the module says; returns the open requests left (0 when drained, None when the server is gone)."""
    started = time.monotonic()
    time.sleep(min(min_wait_s, timeout_s))
    while True:
        left = open_requests(metrics_url)
        if not left or time.monotonic() - started >= timeout_s:
            return left
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics")
    parser.add_argument("--min-wait", type=float, default=5.0, help="seconds to wait before the first check (5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait at most, min-wait included (120)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    left = drain(args.metrics_url, args.min_wait, args.timeout)
    state = "server not answering" if left is None else f"{left:.0f} open request(s) left"
    print(f"drain: {state} after {time.monotonic() - started:.1f} s", flush=True)
    return 0  # a failed preStop only makes an event; the stop goes on either way


if __name__ == "__main__":
    sys.exit(main())
