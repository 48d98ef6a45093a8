"""The engine thread's host work per decode step at 256 streams, this checkout against another, on this machine.

    git worktree add /tmp/old <commit>
    .venv/bin/python bench/host_step_ab.py --old /tmp/old              # 6 pairs of 6 rounds, about 2 minutes

Each run is `bench/gpu/iteration_timeline.py tiny 256 ROUNDS fake` from that tree: the forward computes nothing, so
an iteration is the engine's own Python and torch calls (scheduling, inputs, sampling's launch, accepting tokens),
with the steps going as on CUDA (static shapes, overlapped steps). The trees alternate run by run, each starting
first in turn, so that both see the same moments of a shared machine. Printed per tree, over every round's decode
iterations ("rest" in the timeline): the median milliseconds per iteration (wall and the engine thread's CPU), the
quartiles, and the median of each phase; then new over old.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REST = re.compile(r"  rest: (\d+) it, ([\d.]+) ms \(([\d.]+) ms on the engine thread's CPU\), [\d.]+ ms/it; (.*)")


def rounds_of(tree: Path, streams: int, rounds: int) -> list[dict[str, float]]:
    """Each round's decode iterations: ms per iteration (wall, cpu) and per phase."""
    script = tree / "bench" / "gpu" / "iteration_timeline.py"
    done = subprocess.run([sys.executable, str(script), "tiny", str(streams), str(rounds), "fake"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    found = []
    for match in REST.finditer(done.stdout):
        count = int(match.group(1))
        row = {"wall": float(match.group(2)) / count, "cpu": float(match.group(3)) / count}
        for part in match.group(4).split(", "):
            phase, ms = part.split()
            row[phase] = float(ms)
        found.append(row)
    if not found:
        raise RuntimeError(f"no decode iterations in {script}'s output:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, type=Path, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per run")
    parser.add_argument("--streams", type=int, default=256)
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": ROOT}
    results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    for pair in range(args.pairs):
        for label in (trees if pair % 2 == 0 else reversed(list(trees))):
            results[label] += rounds_of(trees[label], args.streams, args.rounds)
    medians = {}
    for label, rows in results.items():
        wall = [row["wall"] for row in rows]
        quartiles = statistics.quantiles(wall)
        medians[label] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        phases = ", ".join(f"{key} {value:.3f}" for key, value in medians[label].items() if key not in ("wall", "cpu"))
        print(f"{label} ({trees[label]}): {len(rows)} rounds; ms per decode iteration: wall {medians[label]['wall']:.3f} "
              f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}), engine thread CPU {medians[label]['cpu']:.3f}; "
              f"phases {phases}")
    print(f"new / old: wall {medians['new']['wall'] / medians['old']['wall']:.2f}, "
          f"engine thread CPU {medians['new']['cpu'] / medians['old']['cpu']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
