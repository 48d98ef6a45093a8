"""Batch-invariant attention and row counts on the CPU: a query's output, bit for bit, whatever else is in its forward.

A token's numbers must not depend on what shares its forward (other requests, its prompt's other tokens, the
length of the chunk it was prefilled in, a prefix found in the cache), or one request's log probs change with
the load (vLLM's and SGLang's deterministic modes promise the same). Measured on the development machine (an AMD
EPYC with AVX512-BF16, torch 2.13) where the bits moved and what fixes them:

- A matrix product's row depends on how many rows go with it: in float32 one row (a matrix-vector product), two or
  three rows, and the last rows of 5 to 11 at two threads each gave other low bits than a row among four or more.
  Rows padded to a multiple of `ROW_MULTIPLE` gave the same bits at every count up to 2,048 and every position, for
  every weight shape of SmolLM2, in float32 at 1 to 4 threads and in bfloat16 at 1 and 2 (`padded_rows`).
- A lone row's sum is split over the intra-op threads (sampling.py's log-sum-exp has its own fix).
- torch's SDPA picks its blocking (and its kernel) by query and key counts: a prompt's token computed in one
  forward and the same token after a cached prefix differed (up to 1e-5 in a log prob). `attention` here walks each
  row's keys in fixed tiles of `KEY_TILE` keys from position 0: a query's scores tile by tile (its keys past its
  own position masked), the exact maximum over them, then the weights' sums and products tile after tile in the
  same order. Tiles past a query's position add exact zeros, so the result depends only on the query, its keys and
  its position. Every product is a padded batch of `[ROW_MULTIPLE x k, dim] x [dim, KEY_TILE]`, which the
  measurement above showed row-invariant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .block_manager import TRASH_BLOCK

ROW_MULTIPLE = 4
KEY_TILE = 64


def padded_rows(count: int) -> int:
    """`count` rounded up to a multiple of `ROW_MULTIPLE`."""
    return -(-count // ROW_MULTIPLE) * ROW_MULTIPLE


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: torch.Tensor,
              positions: torch.Tensor, scale: float) -> torch.Tensor:
    """`[rows x queries, heads x dim]`: each query `[rows x queries, heads, dim]` (row by row) attending over the
    keys and values at positions 0..its own `positions[row, query]` through its row's block table `[rows, width]`,
    in one layer's pool `[blocks, block_size, kv_heads, dim]` (the queries' own keys and values already written)."""
    rows, queries = positions.shape
    _, block_size, kv_heads, dim = keys.shape
    heads = query.shape[1]
    group = heads // kv_heads
    tile_blocks = max(1, KEY_TILE // block_size)
    tile = tile_blocks * block_size
    width = -(-tables.shape[1] // tile_blocks) * tile_blocks
    if width > tables.shape[1]:  # whole tiles (the extra keys are masked)
        tables = F.pad(tables, (0, width - tables.shape[1]), value=TRASH_BLOCK)
    flat = tables.reshape(-1)
    span = width * block_size
    # In float32 whatever the model's dtype (as SDPA's CPU kernels accumulate): scores and sums in bfloat16 would
    # lose what the softmax needs.
    gathered_keys = keys.index_select(0, flat).view(rows, span, kv_heads, dim).transpose(1, 2).float().contiguous()
    gathered_values = values.index_select(0, flat).view(rows, span, kv_heads, dim).transpose(1, 2).float().contiguous()
    # The query heads that share a key-value head go as its queries: [rows, kv_heads, group x queries, dim].
    grouped = query.view(rows, queries, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(
        rows, kv_heads, group * queries, dim).float()
    count = group * queries
    padded = padded_rows(count)
    query_positions = positions.repeat(1, group)  # grouped row g x queries + q is query q
    if padded > count:  # padding queries at position 0: they see one key (never an empty softmax)
        grouped = F.pad(grouped, (0, 0, 0, padded - count))
        query_positions = F.pad(query_positions, (0, padded - count))
    query_positions = query_positions[:, None, :, None]
    key_index = torch.arange(span, device=query.device)
    scores, largest = [], None
    for start in range(0, span, tile):
        tile_scores = torch.matmul(grouped, gathered_keys[:, :, start : start + tile].transpose(-1, -2)).mul_(scale)
        tile_scores.masked_fill_(key_index[start : start + tile] > query_positions, -torch.inf)
        scores.append(tile_scores)
        tile_largest = tile_scores.amax(-1, keepdim=True)
        largest = tile_largest if largest is None else torch.maximum(largest, tile_largest)
    total = output = None
    for index, start in enumerate(range(0, span, tile)):
        weights = torch.exp(scores[index].sub_(largest))
        tile_total = weights.sum(-1, keepdim=True)
        tile_output = torch.matmul(weights, gathered_values[:, :, start : start + tile])
        total = tile_total if total is None else total.add_(tile_total)
        output = tile_output if output is None else output.add_(tile_output)
    output = output.div_(total)[:, :, :count]
    return output.view(rows, kv_heads, group, queries, dim).permute(0, 3, 1, 2, 4).reshape(
        rows * queries, heads * dim).to(query.dtype)
