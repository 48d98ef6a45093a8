"""A shorter run of bench/soak.py: every request ends with exactly one final response, nothing lost or leaked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import start_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from soak import open_requests_in_model, run_soak  # noqa: E402

pytestmark = pytest.mark.e2e


def test_2000_short_requests_at_64_streams_lose_nothing(tmp_path):
    server = start_server(tmp_path, parameters={"synthetic_step_ms": "2", "max_batch_size": "128"})
    try:
        report = run_soak(server, requests=2000, concurrency=64, tokens=4, sample_at=500)
        assert report.completed == 2000
        assert report.lost == report.duplicated_finals == report.wrong_tokens == 0
        assert report.errors == []
        growth = report.rss_samples[2000] - report.rss_samples[500]
        assert growth < 20 * 2**20, f"stub grew {growth / 2**20:.1f} MB over 1500 requests"
        open_left = open_requests_in_model(server)
        assert open_left in (None, 0.0)
    finally:
        server.stop()
