"""What the embedded engine changes in a transformers model's forward, each measured on an H200
(`bench/step_profile.py`, docs/performance.md): fewer bytes (grouped attention, on every device) and fewer kernels
(fused RMSNorm, on CUDA only) per decode step.

Grouped decode attention (through transformers' `AttentionInterface`). A decode step has one query per row against
the row's gathered blocks. transformers' SDPA path (the version on the GPU image) repeats each key and value head for
every query head it serves (`repeat_kv`, 3x for SmolLM2's 9 query / 3 key-value heads) before SDPA, which triples the
bytes the step moves: here the query heads that share a key-value head are packed as that head's queries instead,
and SDPA reads each key and value once (256 rows: 4.3 against 8.2 ms of kernels a step). Several queries per row
(prefill) go to transformers' own SDPA function unchanged.

Fused RMSNorm: one kernel per norm instead of six.

On the CPU, attention runs on a fixed number of intra-op threads (those torch had when the model was patched), while
cpu_share moves the rest of the forward with the free cores: torch's CPU SDPA splits a decode row's keys by thread
count, so its sums, and the log probs a client gets, would otherwise change with the load on the host (NVIDIA's
end_to_end_test.py --test-bls --return-log-probs compares two runs of one request bit for bit).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "trtllm_grouped_decode"
_attention_threads: int | None = None  # CPU only: intra-op threads for every attention call (see the docstring)


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """`query` `[rows, heads, queries, dim]`, `key`/`value` `[rows, kv_heads, keys, dim]`, a boolean mask
    `[rows, 1, queries, keys]`; returns `[rows, queries, heads, dim]` as transformers' attention functions do."""
    rows, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    with _fixed_threads(query.device):
        if queries != 1 or heads == kv_heads or kwargs.get("position_bias") is not None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                          **kwargs)
        # Query head h reads key-value head h // group (repeat_kv's order): heads of one group are adjacent.
        grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
        output = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                scale=scaling)
    return output.reshape(rows, 1, heads, dim), None


@contextlib.contextmanager
def _fixed_threads(device: torch.device) -> Iterator[None]:
    """On the CPU, torch's intra-op threads set to `_attention_threads` for the block, then back."""
    if device.type != "cpu" or _attention_threads is None or torch.get_num_threads() == _attention_threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(_attention_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def use_grouped_decode_attention(model: torch.nn.Module) -> None:
    """Route `model`'s attention layers through `grouped_decode_attention` (registered once per process)."""
    global _attention_threads
    if _attention_threads is None:
        _attention_threads = torch.get_num_threads()
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, grouped_decode_attention)
    # Set on the config the layers read at every forward; set_attn_implementation would also re-check the model
    # class's declared support, which a registered function does not need.
    model.config._attn_implementation = NAME


def use_fused_rms_norm(model: torch.nn.Module) -> None:
    """Each RMSNorm layer as one `torch.nn.functional.rms_norm` (transformers' own is six kernels: a decode step of
    SmolLM2 launches 61 norms). The fused kernel rounds once where transformers rounds twice (before and after the
    weight), so low-order bits can differ."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_fused_rms_norm_forward, module)


def _fused_rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)
