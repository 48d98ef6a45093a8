"""Where a request's time to first token goes inside the server, from two snapshots of what it already reports:
Triton's statistics for the `tensorrt_llm` model (its queue before `execute()`, the requests an `execute()` call takes,
how long the call took) and the model's own histograms on the metrics port (from `execute()` receiving the request to
the executor taking it, and to its first token). The difference of two snapshots covers what happened between them.

    before = snapshot(http_url, metrics_url); ...; after = snapshot(http_url, metrics_url)
    split(before, after, seconds_between)
    gauges(metrics_url) a few times in between: where the requests the model holds are at that moment

The histograms are observed by the model's `metrics` thread within a time budget, so under load they may lag the
window by up to a period; their means are of the requests observed, not a count of the window's requests.
"""

from __future__ import annotations

import json
import re
import urllib.request

MODEL = "tensorrt_llm"
HISTOGRAMS = {"ttft": "nv_llm_time_to_first_token_seconds", "accepted": "nv_llm_queue_time_seconds"}


def snapshot(http_url: str, metrics_url: str, model: str = MODEL) -> dict[str, float]:
    """Cumulative counters: Triton's queue and execute statistics of `model`, and the sums and counts of its
    histograms."""
    with urllib.request.urlopen(f"{http_url}/v2/models/{model}/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"][0]
    inference = stats["inference_stats"]
    values = {
        "executions": float(stats["execution_count"]),
        "requests": float(stats["inference_count"]),
        "queue_count": float(inference["queue"]["count"]),
        "queue_ns": float(inference["queue"]["ns"]),
        # Triton adds each request its whole batch's time in the stub (from handing the batch over to execute()'s
        # return), so per request this is the duration of the execute() call that took it.
        "execute_ns": float(inference["compute_infer"]["ns"]),
    }
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    for key, name in HISTOGRAMS.items():
        for part in ("sum", "count"):
            match = re.search(rf'^{name}_{part}\{{model="{model}"[^}}]*\}} (\S+)$', text, re.MULTILINE)
            values[f"{key}_{part}"] = float(match.group(1)) if match else 0.0
    return values


# Gauges (as the model last set them): requests the model holds, those waiting in the executor's queue, those in its
# batch, and in the batch those that prefill this iteration.
GAUGES = {
    "open": ("nv_llm_open_requests", ""),
    "queued": ("nv_llm_queued_requests", ""),
    "active": ("nv_trt_llm_request_metrics", 'request_type="active"'),
    "context": ("nv_trt_llm_request_metrics", 'request_type="context"'),
}


def gauges(metrics_url: str, model: str = MODEL) -> dict[str, float | None]:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        lines = response.read().decode().splitlines()
    values: dict[str, float | None] = {}
    for key, (name, label) in GAUGES.items():
        found = [line for line in lines if line.startswith(name + "{") and f'model="{model}"' in line and label in line]
        values[key] = float(found[0].rsplit(" ", 1)[1]) if found else None
    return values


def mean_gauges(samples: list[dict[str, float | None]]) -> dict[str, float | None]:
    keys = samples[0].keys() if samples else GAUGES.keys()
    return {key: (sum(got) / len(got) if (got := [s[key] for s in samples if s[key] is not None]) else None)
            for key in keys}


def split(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float | None]:
    """Means over what happened between two snapshots `seconds` apart, in milliseconds (None where nothing was
    counted); `execute_busy` is the share of those seconds the stub spent in execute() calls."""
    delta = {key: after[key] - before[key] for key in after}

    def mean(total: str, count: str, scale: float) -> float | None:
        return delta[total] * scale / delta[count] if delta[count] > 0 else None

    execute_ms = mean("execute_ns", "requests", 1e-6)
    return {
        "triton_queue_ms": mean("queue_ns", "queue_count", 1e-6),
        "requests_per_execute": mean("requests", "executions", 1.0),
        "execute_ms": execute_ms,
        "execute_busy": None if execute_ms is None else execute_ms * delta["executions"] / 1e3 / seconds,
        "to_executor_ms": mean("accepted_sum", "accepted_count", 1e3),
        "model_ttft_ms": mean("ttft_sum", "ttft_count", 1e3),
    }


def describe(parts: dict[str, float | None], held: dict[str, float | None] | None = None) -> str:
    def fmt(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    counts = "" if held is None else (
        f"; requests held (mean of samples): {fmt(held['open'])} open, {fmt(held['queued'])} in the executor's "
        f"queue, {fmt(held['active'])} in its batch, {fmt(held['context'])} of them prefilling")
    return (f"Triton queue {fmt(parts['triton_queue_ms'])} ms, {fmt(parts['requests_per_execute'], 1)} requests an "
            f"execute() of {fmt(parts['execute_ms'], 2)} ms (busy {fmt(parts['execute_busy'], 2)} of the time); "
            f"from execute(): executor accepted {fmt(parts['to_executor_ms'], 2)} ms, first token "
            f"{fmt(parts['model_ttft_ms'])} ms{counts}")
