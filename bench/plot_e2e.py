"""Plot bench/e2e.py results: tokens a second (in process and through Triton) and the response gap p50 / p99 against
the number of streams, each point the median of the runs' pairs with their range as bars.

    bench/.perf-venv/bin/python bench/plot_e2e.py docs/gpu_streams.png bench/results/gpu/<card>/<date>/e2e-*.json

Runs where matplotlib is (bench/.perf-venv: bench/perf_analyzer.py --setup, then pip install matplotlib there).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def points(paths: list[str]) -> tuple[dict, str, str]:
    """load -> {series: [values]} over every pair of every file; the card and the instance setting."""
    series: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    card, instances = "", ""
    for path in paths:
        with open(path) as file:
            report = json.load(file)
        settings = report.get("settings", {})
        card = settings.get("card", card)
        instances = f"{settings.get('instances_used')} instance(s)" + (
            " (default)" if settings.get("instances") is None else "")
        for run in report.get("runs", [report]):
            for p in run.get("in_process", []):
                series[p["load_streams"]]["in process"].append(p["generated_tokens_per_s"])
            for p in run.get("triton", []):
                load = p["load_streams"]
                series[load]["through Triton"].append(p["delivered_tokens_per_s"])
                for key in ("gap_p50_ms", "gap_p99_ms"):
                    if p.get(key) is not None:
                        series[load][key].append(p[key])
    return series, card, instances


def main(target: str, paths: list[str]) -> int:
    series, card, instances = points(paths)
    loads = sorted(series)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for axis, names, unit in ((left, ("in process", "through Triton"), "tokens / s"),
                              (right, ("gap_p50_ms", "gap_p99_ms"), "ms between a stream's responses")):
        for name in names:
            xs = [load for load in loads if series[load][name]]
            values = [series[load][name] for load in xs]
            medians = [statistics.median(v) for v in values]
            bars = [[m - min(v) for m, v in zip(medians, values)], [max(v) - m for m, v in zip(medians, values)]]
            axis.errorbar(xs, medians, yerr=bars, marker="o", capsize=3, label=name.replace("_ms", "").replace("_", " "))
        axis.set_xscale("log", base=2)
        axis.set_xticks(loads, [str(load) for load in loads])
        axis.set_xlabel("streams (64-token chat requests, greedy)")
        axis.set_ylabel(unit)
        axis.grid(True, alpha=0.3)
        axis.legend()
    left.set_title("generated (in process) and delivered (Triton)")
    right.set_title("response gap through Triton")
    figure.suptitle(f"SmolLM2-135M bf16 on {card}, {instances}: median of the pairs, bars the range")
    figure.tight_layout()
    figure.savefig(target, dpi=110)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
