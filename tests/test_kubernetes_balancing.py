"""Two replicas (two real servers on their own ports): the project's load client spreads its streams over both.

A gRPC stream is one long-lived HTTP/2 call: behind a ClusterIP Service every stream of a connection lands on one
pod. The manifests pair a headless Service with client-side balancing (docs/kubernetes.md, "Load balancing");
client_examples/concurrent_load.py takes the replicas' addresses and sends stream i to replica i mod n. Each
replica's own counter of finished requests shows where the work went.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import start_server
from prometheus_text import scrape
from test_kubernetes_manifests import ROOT

pytestmark = pytest.mark.e2e

LOAD_CLIENT = ROOT / "client_examples" / "concurrent_load.py"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    servers = [start_server(tmp_path_factory.mktemp(f"replica{i}"), executor="synthetic") for i in range(2)]
    yield servers
    for server in servers:
        server.stop()


def finished(server) -> float:
    return sum(scrape(server.metrics_url).find("nv_llm_requests_finished_total", model="tensorrt_llm").values())


def run_load(urls: list[str], streams: int, requests: int) -> None:
    done = subprocess.run(
        [sys.executable, str(LOAD_CLIENT), f"--url={','.join(urls)}", f"--streams={streams}",
         f"--requests={requests}", "--max-tokens=16", "--no-chat-template", "--timeout=60"],
        capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"streams {streams}, requests {streams * requests}," in done.stdout, done.stdout


def wait_for_counts(replicas, expected: list[float]) -> list[float]:
    deadline = time.monotonic() + 10
    while True:  # the metrics thread flushes every stats_check_period_ms
        counts = [finished(server) for server in replicas]
        if counts == expected or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def test_load_client_spreads_streams_over_both_replicas(replicas):
    before = [finished(server) for server in replicas]
    run_load([server.grpc_url for server in replicas], streams=6, requests=3)
    # 6 streams of 3 requests each: 3 streams, 9 requests per replica.
    assert wait_for_counts(replicas, [before[0] + 9, before[1] + 9]) == [before[0] + 9, before[1] + 9]


def test_one_address_sends_every_stream_to_one_replica(replicas):
    """The control: what a single connection-level address does (all the work on one replica)."""
    before = [finished(server) for server in replicas]
    run_load([replicas[1].grpc_url], streams=4, requests=2)
    assert wait_for_counts(replicas, [before[0], before[1] + 8]) == [before[0], before[1] + 8]
