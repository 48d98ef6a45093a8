"""The KV block pool as a transformers `Cache`: new keys land in their slots, each row reads back its own blocks in
position order, and the mask hides every key past a query's position (other rows' blocks, padding, stale slots)."""

from __future__ import annotations

import psutil
import pytest
import torch

from trtllm_model.embedded.block_manager import TRASH_BLOCK
from trtllm_model.embedded.kv_cache import KvBlockPool, PagedCache, StepInputs

BLOCK = 4


def pool(num_blocks: int = 8) -> KvBlockPool:
    return KvBlockPool(num_layers=2, num_blocks=num_blocks, block_size=BLOCK, num_kv_heads=1, head_dim=2,
                       dtype=torch.float32, device=torch.device("cpu"))


def step(rows: list[tuple[list[int], int, int]], width: int) -> tuple[StepInputs, torch.Tensor]:
    """rows: (block ids, first new position, new tokens); left-padded queries. Returns the inputs and keys whose
    value is label * 100 + position (label = row + 1; padding: -1)."""
    queries = max(count for _, _, count in rows)
    positions = torch.zeros(len(rows), queries, dtype=torch.long)
    slots = torch.full((len(rows), queries), TRASH_BLOCK * BLOCK, dtype=torch.long)
    tables = torch.full((len(rows), width), TRASH_BLOCK, dtype=torch.long)
    keys = torch.full((len(rows), 1, queries, 2), -1.0)
    for row, (blocks, start, count) in enumerate(rows):
        tables[row, : len(blocks)] = torch.tensor(blocks)
        for j, position in enumerate(range(start, start + count)):
            column = queries - count + j
            positions[row, column] = position
            slots[row, column] = blocks[position // BLOCK] * BLOCK + position % BLOCK
            keys[row, 0, column] = (row + 1) * 100 + position
    ids = torch.zeros_like(positions)
    return StepInputs(ids, positions, slots.reshape(-1), tables), keys


def forward(kv: KvBlockPool, inputs: StepInputs, keys: torch.Tensor) -> torch.Tensor:
    cache = PagedCache(kv, inputs)
    for layer in range(2):
        gathered, values = cache.update(keys, keys + 0.5, layer)
    return torch.where(gathered == 0, gathered, values - 0.5)[:, 0, :, 0]  # [rows, width x BLOCK], values checked


def test_prefill_then_decode_reads_each_rows_own_tokens_in_order():
    kv = pool()
    # Row 0: 6 tokens in blocks 3, 1; row 1: 2 tokens in block 5 (left-padded by 4).
    inputs, keys = step([([3, 1], 0, 6), ([5], 0, 2)], width=2)
    gathered = forward(kv, inputs, keys)
    assert gathered[0, :6].tolist() == [100 + p for p in range(6)]
    assert gathered[1, :2].tolist() == [200, 201]
    mask = inputs.attention_mask(BLOCK)[:, 0]
    assert mask.shape == (2, 6, 8)
    assert mask[0, 5].tolist() == [True] * 6 + [False] * 2  # the last query: its 6 tokens
    assert mask[1, 5].tolist() == [True, True] + [False] * 6  # row 1's last query: its 2, not the padding
    assert mask[1, 0].tolist() == [True] + [False] * 7  # a padding query sees one key: never an empty row

    # Decode one token each: row 0 at position 6 (block 1), row 1 at position 2 (block 5).
    inputs, keys = step([([3, 1], 6, 1), ([5], 2, 1)], width=2)
    gathered = forward(kv, inputs, keys)
    assert gathered[0, :7].tolist() == [100 + p for p in range(7)]
    assert gathered[1, :3].tolist() == [200, 201, 202]
    assert inputs.attention_mask(BLOCK)[:, 0, 0].sum(-1).tolist() == [7, 3]


def test_padding_writes_only_the_trash_block():
    kv = pool()
    before = [tensor.clone() for tensor in kv.keys]
    inputs, keys = step([([2], 0, 1), ([4], 0, 3)], width=1)  # row 0 has two padding queries
    forward(kv, inputs, keys)
    for layer, old in enumerate(before):
        changed = (kv.keys[layer] != old).any(-1).any(-1).any(-1).nonzero().flatten().tolist()
        assert set(changed) <= {TRASH_BLOCK, 2, 4}
        assert kv.keys[layer][2, 0, 0, 0] == 100 and kv.keys[layer][4, :3, 0, 0].tolist() == [200, 201, 202]


def test_a_shared_block_is_read_by_both_rows_and_written_by_neither():
    kv = pool()
    inputs, keys = step([([1, 2], 0, 6)], width=2)  # block 1 full: the shared prefix
    forward(kv, inputs, keys)
    shared = kv.keys[0][1].clone()
    # Two rows continue after the shared block, each in a block of its own.
    inputs, keys = step([([1, 3], 4, 2), ([1, 6], 4, 1)], width=2)
    gathered = forward(kv, inputs, keys)
    assert torch.equal(kv.keys[0][1], shared)
    assert gathered[0, :4].tolist() == gathered[1, :4].tolist() == [100, 101, 102, 103]
    assert gathered[0, 4:6].tolist() == [104, 105] and gathered[1, 4].item() == 204


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_pool_is_zeros_whose_memory_follows_what_is_written(dtype):
    """Zeros (a masked key's zero weight times NaN would be NaN), each layer's keys and values a tensor of their own,
    and a 768 MB pool takes memory only where it is written (the OS maps calloc'd pages on first touch)."""
    process = psutil.Process()
    before = process.memory_info().rss
    kv = KvBlockPool(num_layers=32, num_blocks=2048, block_size=16, num_kv_heads=3, head_dim=64,
                     dtype=dtype, device=torch.device("cpu"))
    assert kv.nbytes() == 2 * 32 * 2048 * 16 * 3 * 64 * dtype.itemsize >= 768 << 20
    kv.keys[5][7].fill_(1.0)
    kv.values[31][2047].fill_(2.0)
    assert process.memory_info().rss - before < 64 << 20
    assert all(tensor.shape == (2048, 16, 3, 64) and tensor.dtype == dtype and tensor.is_contiguous()
               for tensor in (*kv.keys, *kv.values))
    assert kv.keys[5][7].eq(1.0).all() and kv.keys[5][[6, 8]].eq(0).all() and kv.keys[4][7].eq(0).all()
    assert kv.values[31][2047].eq(2.0).all() and kv.keys[31][2047].eq(0).all() and kv.values[0][0].eq(0).all()
