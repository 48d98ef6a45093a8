"""The KV block pool and the per-step view of it that plugs into a transformers model as its `Cache`.

Each layer's keys and values live in one preallocated tensor `[blocks, block_size, kv_heads, head_dim]`
(`KvBlockPool`); which blocks belong to which sequence is `block_manager`'s business. A forward gets a
`PagedCache` built from the step's inputs: in every attention layer it writes the new tokens' keys and values to
their slots (`slot_mapping`, one flat index per query token; padding writes to the trash block), then gathers each
row's blocks (`block_tables`) into `[rows, kv_heads, blocks x block_size, head_dim]` for the model's own SDPA,
which the step's boolean mask (key position <= query position) restricts to the row's real tokens. Every tensor
of a step has a shape fixed by (rows, query length, table width), so a decode step padded to bucketed sizes can be
replayed by a CUDA graph once those inputs are copied into static buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer


class KvBlockPool:
    """Keys and values of every block in every layer."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        # Zeros, not garbage: masked keys are multiplied by zero weights, and 0 * NaN is NaN.
        if device.type == "cpu":
            # One calloc'd allocation (numpy's zeros): the OS maps zeroed pages as they are first touched, so memory
            # follows the load. (Zeroing blocks when first handed out cost a 2,048-token prompt's first step 110-220
            # ms on 2 cores: page faults for all its blocks at once, in every decoding stream's gap.)
            whole = _calloc((2, num_layers, *shape), dtype)
            # One view a layer (`select`, not `unbind`: a view among several may not be written in place).
            self.keys = [whole[0, layer] for layer in range(num_layers)]
            self.values = [whole[1, layer] for layer in range(num_layers)]
        else:
            self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
            self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def num_blocks(self) -> int:
        return self.keys[0].shape[0]

    def nbytes(self) -> int:
        return 2 * len(self.keys) * self.keys[0].numel() * self.keys[0].element_size()


def _calloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor whose pages are untouched (torch.zeros writes every page at once)."""
    return torch.from_numpy(np.zeros(math.prod(shape) * dtype.itemsize, dtype=np.uint8)).view(dtype).view(shape)


@dataclass(slots=True)
class StepInputs:
    """One forward's tensors, all on the model's device. Rows are sequences, queries are their new tokens
    (left-padded to the longest), the table width covers the longest row's blocks."""

    input_ids: torch.Tensor  # [rows, queries]
    positions: torch.Tensor  # [rows, queries]; padding: 0
    slot_mapping: torch.Tensor  # [rows * queries]: block * block_size + offset; padding: a slot of the trash block
    block_tables: torch.Tensor  # [rows, width]; past a row's blocks: the trash block

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The four tensors in field order (what the runner copies to the device, a graph's capture saves)."""
        return self.input_ids, self.positions, self.slot_mapping, self.block_tables

    def attention_mask(self, block_size: int) -> torch.Tensor:
        """`[rows, 1, queries, width x block_size]`: a query sees the keys at or before its own position, so never
        another row's, nor past its own context; a padding query (position 0) sees one key and is never empty."""
        keys = torch.arange(self.block_tables.shape[1] * block_size, device=self.positions.device)
        return (keys[None, None, :] <= self.positions[:, :, None])[:, None]


class _PoolLayer(DynamicLayer):
    """One decoder layer: writes the step's new keys and values into the pool, returns its rows' gathered blocks."""

    def __init__(self, owner: PagedCache, index: int) -> None:
        super().__init__()
        self.owner, self.index = owner, index
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        owner = self.owner
        keys, values = owner.pool.keys[self.index], owner.pool.values[self.index]
        rows, heads, _, dim = key_states.shape
        # [rows, heads, queries, dim] -> one [heads, dim] entry per query token, at its slot.
        keys.view(-1, heads, dim).index_copy_(0, owner.slots, key_states.transpose(1, 2).reshape(-1, heads, dim))
        values.view(-1, heads, dim).index_copy_(0, owner.slots, value_states.transpose(1, 2).reshape(-1, heads, dim))
        width = owner.tables.shape[1] * keys.shape[1]
        gathered_keys = keys.index_select(0, owner.flat_tables).view(rows, width, heads, dim).transpose(1, 2)
        gathered_values = values.index_select(0, owner.flat_tables).view(rows, width, heads, dim).transpose(1, 2)
        return gathered_keys, gathered_values

    def get_seq_length(self) -> int:
        return self.owner.tables.shape[1] * self.owner.pool.block_size

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length(), 0


class PagedCache(Cache):
    """The pool as one forward's `Cache` (the engine passes the mask and position ids itself)."""

    def __init__(self, pool: KvBlockPool, inputs: StepInputs) -> None:
        super().__init__(layers=[_PoolLayer(self, index) for index in range(len(pool.keys))])
        self.pool = pool
        self.slots = inputs.slot_mapping
        self.tables = inputs.block_tables
        self.flat_tables = inputs.block_tables.reshape(-1)
