"""Does a matrix product give a row the same bits whatever the number of rows beside it, on this CPU?

For SmolLM2's weight shapes (random weights), the first n rows of `F.linear(x[:padded], w)` (n rounded up to a
multiple) are compared with the same rows of the product over 512 rows, for n from 1 to 69 and a few larger counts.
A line per multiple says OK or the first (weight shape, n) that differed. MKL reads `MKL_CBWR` once, at the process's
first product, so the mode is set by starting the script with it:

    .venv/bin/python bench/row_invariance.py --dtype float32 --threads 2
    MKL_CBWR=AUTO,STRICT .venv/bin/python bench/row_invariance.py --dtype float32 --threads 2

embedded/row_invariance.py says what the engine does with the answer.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]  # SmolLM2's projections and head
COUNTS = [*range(1, 70), 100, 127, 128, 200, 255, 256, 300]


def first_difference(dtype: torch.dtype, multiple: int) -> tuple[int, int, int] | None:
    generator = torch.Generator().manual_seed(0)
    for out_features, in_features in SHAPES:
        weight = (torch.randn(out_features, in_features, generator=generator) * 0.05).to(dtype)
        rows = torch.randn(512, in_features, generator=generator).to(dtype)
        reference = F.linear(rows, weight)
        for count in COUNTS:
            padded = -(-count // multiple) * multiple
            if not torch.equal(F.linear(rows[:padded], weight)[:count], reference[:count]):
                return out_features, in_features, count
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {args.dtype}, {args.threads} threads, MKL_CBWR={os.environ.get('MKL_CBWR', 'unset')}")
    for multiple in args.multiples:
        differs = first_difference(dtype, multiple)
        verdict = "OK" if differs is None else f"differs first at weight {differs[:2]}, {differs[2]} rows"
        print(f"  rows padded to a multiple of {multiple:3d}: {verdict}", flush=True)


if __name__ == "__main__":
    main()
