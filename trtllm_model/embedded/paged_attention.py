"""Decode attention over the KV block pool as one Triton kernel (CUDA): each row's query reads its keys and values
where they lie in the pool, up to its own position.

The eager path (`fused_forward.FusedForward._attend`) gathers every row's blocks into `[rows, kv_heads, width x
block_size, dim]` copies padded to the widest table, then runs SDPA with a mask: per layer two gathers written and
read again, and every row reading the widest row's keys. Here a program takes one row and one key-value head (the
query heads that share it, padded to 16 for `tl.dot`), walks the row's keys a tile at a time through its block
table and keeps an online softmax. A row's keys are not split over several programs (flash-decoding's split): a
step's rows already make many programs, and chat contexts are short; a single stream with a long context would gain
from the split. The loop's bound is read from `positions` on the device, so a CUDA graph replays it for any context
up to its bucket's width. Measured on an H200: docs/performance.md ("decode attention as one kernel a layer").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TILE = 64  # keys a loop iteration reads (4 blocks of 16)
_GROUP_PAD = 16  # tl.dot's least M


@triton.jit
def _decode_attention(query, keys, values, tables, positions, output, scale, query_row_stride, query_head_stride,
                      table_row_stride,
                      BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                      GROUP_PAD: tl.constexpr, DIM: tl.constexpr, TILE: tl.constexpr, PRECISION: tl.constexpr,
                      UPCAST: tl.constexpr):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    heads = kv_head * GROUP + tl.arange(0, GROUP_PAD)
    real_heads = tl.arange(0, GROUP_PAD) < GROUP
    dims = tl.arange(0, DIM)
    q = tl.load(query + row * query_row_stride + heads[:, None] * query_head_stride + dims[None, :], mask=real_heads[:, None],
                other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    length = tl.load(positions + row) + 1  # keys at or before the row's own position
    largest = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
    for start in range(0, length, TILE):
        key_index = start + tl.arange(0, TILE)
        real_keys = key_index < length
        block = tl.load(tables + row * table_row_stride + key_index // BLOCK_SIZE, mask=real_keys, other=0)
        offsets = (block * BLOCK_SIZE + key_index % BLOCK_SIZE)[:, None] * (KV_HEADS * DIM) + kv_head * DIM
        k = tl.load(keys + offsets + dims[None, :], mask=real_keys[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(real_keys[None, :], scores, float("-inf"))
        new_largest = tl.maximum(largest, tl.max(scores, 1))
        shrink = tl.exp(largest - new_largest)
        weights = tl.exp(scores - new_largest[:, None])
        total = total * shrink + tl.sum(weights, 1)
        v = tl.load(values + offsets + dims[None, :], mask=real_keys[:, None], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * shrink[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
        largest = new_largest
    out = acc / total[:, None]
    tl.store(output + row * (KV_HEADS * GROUP * DIM) + heads[:, None] * DIM + dims[None, :],
             out.to(output.dtype.element_ty), mask=real_heads[:, None])


def supports(heads: int, kv_heads: int, dim: int) -> bool:
    """Whether the kernel takes these heads: at most 16 query heads a key-value head, a power-of-two dim >= 16."""
    return heads % kv_heads == 0 and heads // kv_heads <= _GROUP_PAD and dim >= 16 and dim & (dim - 1) == 0


def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: torch.Tensor,
                     positions: torch.Tensor, scale: float) -> torch.Tensor:
    """`[rows, heads x dim]`: each row's query `[rows, heads, dim]` attending over the keys and values at positions
    0..`positions[row]` of its block table `[rows, width]`, in one layer's pool `[blocks, block_size, kv_heads,
    dim]` (the row's own key and value already written)."""
    rows, heads, dim = query.shape
    _, block_size, kv_heads, _ = keys.shape
    if not supports(heads, kv_heads, dim):
        raise ValueError(f"decode_attention: {heads} heads over {kv_heads} key-value heads of {dim} is not supported")
    if query.stride(2) != 1 or not keys.is_contiguous() or not values.is_contiguous():
        raise ValueError("decode_attention needs each head's query contiguous and a contiguous pool")
    output = torch.empty((rows, heads * dim), dtype=query.dtype, device=query.device)
    _decode_attention[(rows, kv_heads)](
        query, keys, values, tables, positions, output, scale, query.stride(0), query.stride(1), tables.stride(0),
        BLOCK_SIZE=block_size, KV_HEADS=kv_heads, GROUP=heads // kv_heads, GROUP_PAD=_GROUP_PAD, DIM=dim,
        TILE=_TILE, PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        # Triton's interpreter (CPU tensors: the tests) gets a bfloat16 tl.dot wrong; there every dot is float32.
        UPCAST=query.device.type == "cpu")
    return output
