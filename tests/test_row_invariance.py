"""`deterministic` on the CPU relies on products whose rows keep their bits whatever rows go with them. What
row_invariance picks on this host must have that property: in a fresh process (MKL reads its mode at the first
product), after asking for MKL's strict mode, the dtype chosen for SmolLM2-shaped weights gives each row the same bits
at every probed row count, in bfloat16 and float32."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from trtllm_model.server import PROJECT_ROOT

CHECK = textwrap.dedent("""
    import sys
    import torch
    from trtllm_model.embedded import row_invariance

    row_invariance.ask_for_reproducible_blas()
    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(1)
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]  # SmolLM2's qkv, o, gate_up, down, head
    weights = [(torch.randn(shape, generator=generator) * 0.05).to(getattr(torch, sys.argv[1])) for shape in shapes]
    chosen = row_invariance.product_dtype(weights)
    print(chosen, row_invariance.rows_are_invariant(weights, chosen))
""")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_chosen_product_dtype_keeps_every_rows_bits(dtype):
    done = subprocess.run([sys.executable, "-c", CHECK, dtype], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    chosen, invariant = done.stdout.split()
    assert chosen in (f"torch.{dtype}", "torch.float32")
    assert invariant == "True", done.stderr[-3000:]
