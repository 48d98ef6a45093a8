"""Whether a matrix product gives a row the same bits whatever rows go with it, on this host; and how to make it so.

`deterministic` pads a forward's rows to a multiple of `invariant_attention.ROW_MULTIPLE` and needs the products
then to be row-invariant. Whether they are is the host's BLAS's doing, not torch's (`bench/row_invariance.py`, torch
2.13, 2 threads):

- float32 goes to MKL's sgemm. On an Intel Xeon with AMX (2026-12-08) a row's last bits moved with the row count at
  every multiple tried up to 64; MKL's strict conditional numerical reproducibility (`MKL_CBWR=AUTO,STRICT`) made
  every count the same from one row up. MKL reads it once, at the process's first product, so it is asked for before
  the model loads (`ask_for_reproducible_blas`).
- bfloat16 goes to oneDNN, which has no such mode: on that Xeon rows moved at every multiple; on an AMD EPYC with
  AVX512-BF16 (2026-12-07) multiples of four held. So the model's bfloat16 weights are checked when the forward is
  built (`rows_are_invariant`), and where they fail, the products run in float32 (weights copied once), under MKL's
  strict mode, their results rounded back to bfloat16.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .invariant_attention import padded_rows

log = logging.getLogger(__name__)

REPRODUCIBLE_MKL = ("MKL_CBWR", "AUTO,STRICT")
# Row counts checked against the same rows among REFERENCE_ROWS: every count to 69 (bfloat16 on the Xeon first
# differed at 48 rows) and those around 128. A weight's first PROBED_OUTPUTS rows stand for it (the head's 49,152
# would take seconds at every start; with these, 0.2 s on 2 cores).
PROBED_COUNTS = (*range(1, 70), 127, 128, 129)
REFERENCE_ROWS = 136
PROBED_OUTPUTS = 4096


def ask_for_reproducible_blas() -> None:
    """MKL's strict reproducible mode for this process's float32 products, unless its environment says otherwise.
    It takes effect only if no product ran in the process before (`rows_are_invariant` tells)."""
    os.environ.setdefault(*REPRODUCIBLE_MKL)


def rows_are_invariant(weights: Iterable[torch.Tensor], dtype: torch.dtype) -> bool:
    """Whether, for each weight (as `dtype`), the first n rows of a product over `padded_rows(n)` rows equal the same
    rows of the product over REFERENCE_ROWS rows, for every n in PROBED_COUNTS, on this host now."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in weights:
            weight = weight[:PROBED_OUTPUTS].to(dtype)
            rows = torch.randn(REFERENCE_ROWS, weight.shape[1], generator=generator).to(dtype)
            reference = F.linear(rows, weight)
            for count in PROBED_COUNTS:
                if not torch.equal(F.linear(rows[: padded_rows(count)], weight)[:count], reference[:count]):
                    return False
    return True


def product_dtype(weights: list[torch.Tensor]) -> torch.dtype:
    """The dtype a deterministic forward's products run in on this CPU: the weights' own where their rows are
    invariant, else float32 (logged; and a warning where float32's are not either)."""
    dtype = weights[0].dtype
    if rows_are_invariant(weights, dtype):
        return dtype
    if dtype != torch.float32 and rows_are_invariant(weights, torch.float32):
        log.info("deterministic: %s products on this CPU give a row other bits beside other rows; they run in "
                 "float32 (MKL's strict mode) instead", dtype)
        return torch.float32
    log.warning("deterministic: this CPU's products give a row other bits beside other rows, in float32 too (%s=%s, "
                "which counts only if set before the process's first product): a request's log probs may move in "
                "their last bits with the load", REPRODUCIBLE_MKL[0], os.environ.get(REPRODUCIBLE_MKL[0], "unset"))
    return dtype
