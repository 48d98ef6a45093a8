"""Rows of different sizes split into forwards, each row padded to the largest of its forward: the split that
computes least, counting each forward's own cost besides its padded rows. The runner splits a CPU decode step's rows
by block-table width (one long context no longer makes every row gather its width); the engine splits prompt chunks
by length (a forward costs the host the same launches whatever its shape, so on a GPU few forwards of more padding
beat many snug ones)."""

from __future__ import annotations

import numpy as np


def padded_groups(sizes: list[int], forward_cost: float) -> list[list[int]]:
    """Indices of `sizes` in runs of the largest first, chosen so that the sum over forwards of `forward_cost` plus
    (rows x the forward's largest size) is least. One group when the padding costs less than a forward."""
    order = sorted(range(len(sizes)), key=lambda row: -sizes[row])
    if max(sizes) * len(sizes) - sum(sizes) <= forward_cost:
        return [order]
    ordered = np.array([sizes[row] for row in order], dtype=np.float64)
    count = len(order)
    # best[i]: the least cost of the first i rows (largest first); start[i]: where the last forward of that split
    # begins. Each end's candidates at once in numpy: row by row in Python cost milliseconds at 256 rows.
    best, start = np.zeros(count + 1), np.zeros(count + 1, dtype=np.int64)
    for end in range(1, count + 1):
        begins = np.arange(end)
        costs = best[:end] + forward_cost + (end - begins) * ordered[:end]
        start[end] = int(costs.argmin())
        best[end] = costs[start[end]]
    groups, end = [], count
    while end:
        groups.append(order[start[end] : end])
        end = int(start[end])
    return groups[::-1]
