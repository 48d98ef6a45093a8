"""The running batch's KV cache: one preallocated, left-padded buffer per layer that rows join and leave.

Row i holds its `length` real tokens right-aligned in the columns `[end - length, end)`; the columns before are
padding that the attention mask hides. The buffer is written in place (no `torch.cat` per step), a finished row
is replaced by the last row (one row copied, not the whole batch), and dropping the padding that nobody needs
any more only moves `start`. The class plugs into transformers as a `Cache`, so the model's own forward runs
unchanged; the engine passes a ready 4-D boolean mask and explicit position ids.

Growth doubles the room it lacks (few reallocations), but never past `max_slots` rows x columns when that is set:
the scheduler admits only what fits there (`kv_budget`), so the exact size needed always does. Such a budgeted
cache keeps one buffer of `max_slots` per layer for its whole life and reshapes it in place: allocating a new
buffer beside the old one, as the unbounded cache does, held both at once and left freed ones in the heap (the
process reached twice the budget).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _BufferLayer(DynamicLayer):
    """One decoder layer's keys and values; positions come from the owning cache."""

    def __init__(self, owner: BatchKVCache) -> None:
        super().__init__()
        self.owner = owner
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        cache = self.owner
        end = cache.end + key_states.shape[2]
        self.keys[: cache.rows, :, cache.end : end] = key_states
        self.values[: cache.rows, :, cache.end : end] = value_states
        return self.keys[: cache.rows, :, cache.start : end], self.values[: cache.rows, :, cache.start : end]

    def get_seq_length(self) -> int:
        return self.owner.end - self.owner.start

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


class BatchKVCache(Cache):
    """Keys and values of every running sequence, `[rows, kv_heads, columns, head_dim]` per layer."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        rows: int = 0,
        columns: int = 0,
        max_slots: int | None = None,
    ) -> None:
        super().__init__(layers=[_BufferLayer(self) for _ in range(num_layers)])
        self.shape = (num_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.max_slots = max_slots
        self.rows = 0
        self.start = 0  # first column any row still needs
        self.end = 0  # one past the last written column
        self.lengths: list[int] = []  # real tokens per row
        # Pages of `empty` memory count only once written, so the resident memory follows what is used.
        self._storage = None
        if max_slots is not None:
            size = max_slots * num_kv_heads * head_dim
            self._storage = [
                (torch.empty(size, dtype=dtype, device=device), torch.empty(size, dtype=dtype, device=device))
                for _ in range(num_layers)
            ]
        self._allocate(max(rows, 1), max(columns, 16))

    # -- sizes -------------------------------------------------------------------------------------------------
    @property
    def span(self) -> int:
        """Columns in use: the longest row's length."""
        return self.end - self.start

    @property
    def capacity(self) -> tuple[int, int]:
        keys = self.layers[0].keys
        return keys.shape[0], keys.shape[2]

    def nbytes(self) -> int:
        keys = self.layers[0].keys
        return 2 * len(self.layers) * keys.numel() * keys.element_size()

    def _allocate(self, rows: int, columns: int, left_room: int = 0) -> None:
        """(Re)allocate the buffers; the used columns move to `[left_room, left_room + span)`."""
        shape = (rows, *self.shape[:1], columns, self.shape[1])
        count = rows * columns * self.shape[0] * self.shape[1]
        in_place = self._storage is not None and count <= self._storage[0][0].numel()
        new_start = left_room
        for index, layer in enumerate(self.layers):
            used = None
            if layer.keys is not None and self.rows:
                used = (layer.keys[: self.rows, :, self.start : self.end], layer.values[: self.rows, :, self.start : self.end])
            if in_place:
                if used is not None:  # the new shape overlaps the old one in the same buffer
                    used = (used[0].clone(), used[1].clone())
                key_store, value_store = self._storage[index]
                keys, values = key_store[:count].view(shape), value_store[:count].view(shape)
                # Zeros, not stale memory: padding columns are masked, but 0 * NaN would still poison sums.
                keys.zero_()
                values.zero_()
            else:
                keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
                values = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if used is not None:
                keys[: self.rows, :, new_start : new_start + self.span] = used[0]
                values[: self.rows, :, new_start : new_start + self.span] = used[1]
            layer.keys, layer.values = keys, values
        self.start, self.end = new_start, new_start + self.span

    def _ensure_room(self, rows: int, left: int, right: int) -> None:
        """Make room for `rows` rows, `left` more columns before `start` and `right` more after `end`."""
        row_cap, col_cap = self.capacity
        if rows <= row_cap and left <= self.start and self.end + right <= col_cap:
            return
        needed = left + self.span + right
        new_rows = row_cap if rows <= row_cap else max(rows, 2 * row_cap)
        new_columns = col_cap if needed <= col_cap else max(needed, 2 * col_cap)
        if self.max_slots is not None and new_rows * new_columns > self.max_slots:
            # Exact rows; columns (they grow every step) get what the budget leaves, at least what is needed.
            new_rows = rows
            new_columns = max(needed, min(new_columns, self.max_slots // max(rows, 1)))
        self._allocate(new_rows, new_columns, left_room=left)

    # -- per step ----------------------------------------------------------------------------------------------
    def reserve(self, query_length: int) -> None:
        """Before a forward: room for `query_length` new columns."""
        self._ensure_room(self.rows, 0, query_length)

    def advance(self, query_length: int) -> None:
        """After a forward over `query_length` tokens of every row."""
        self.end += query_length
        self.lengths = [length + query_length for length in self.lengths]

    def begin_prefill(self, lengths: list[int]) -> None:
        """On an empty cache: one row per prompt, left-padded to the longest."""
        assert self.rows == 0, "prefill goes into a fresh cache, then append_rows() merges it"
        self.rows, self.start, self.end = len(lengths), 0, 0
        self.lengths = [0] * len(lengths)
        self.reserve(max(lengths))

    def finish_prefill(self, lengths: list[int]) -> None:
        self.end = max(lengths)
        self.lengths = list(lengths)

    def prefill_mask(self, lengths: list[int]) -> torch.Tensor:
        """`[rows, 1, span, span]`: causal over each row's real tokens. A padding query sees only itself, so no row
        of the mask is empty (an empty row gives NaN in attention)."""
        span = max(lengths)
        padding = torch.tensor([span - length for length in lengths], device=self.device)
        positions = torch.arange(span, device=self.device)
        causal = positions[None, :, None] >= positions[None, None, :]
        real_key = positions[None, None, :] >= padding[:, None, None]
        diagonal = torch.eye(span, dtype=torch.bool, device=self.device)[None]
        return (causal & real_key | diagonal)[:, None]

    def decode_mask(self) -> torch.Tensor:
        """`[rows, 1, 1, span + 1]`, True where the new token may attend (its row's real tokens and itself)."""
        padding = torch.tensor([self.span - length for length in self.lengths], device=self.device)
        columns = torch.arange(self.span + 1, device=self.device)
        return (columns[None, :] >= padding[:, None])[:, None, None, :]

    # -- membership ----------------------------------------------------------------------------------------------
    def append_rows(self, other: BatchKVCache) -> None:
        """Copy every row of `other` (a freshly prefilled group) to the end of this batch."""
        if self.rows == 0:
            self.start = self.end = 0
        grow_left = max(0, other.span - self.span)
        self._ensure_room(self.rows + other.rows, grow_left, 0)
        self.start -= grow_left
        first, last = self.rows, self.rows + other.rows
        for mine, theirs in zip(self.layers, other.layers):
            mine.keys[first:last, :, self.end - other.span : self.end] = theirs.keys[
                : other.rows, :, other.start : other.end
            ]
            mine.values[first:last, :, self.end - other.span : self.end] = theirs.values[
                : other.rows, :, other.start : other.end
            ]
        self.rows = last
        self.lengths.extend(other.lengths)

    def remove_rows(self, indices: list[int]) -> list[tuple[int, int]]:
        """Drop rows; the last rows move into the holes. Returns the moves `(from_row, to_row)` in order."""
        moves = []
        for index in sorted(set(indices), reverse=True):
            last = self.rows - 1
            if index != last:
                for layer in self.layers:
                    layer.keys[index] = layer.keys[last]
                    layer.values[index] = layer.values[last]
                self.lengths[index] = self.lengths[last]
                moves.append((last, index))
            self.lengths.pop()
            self.rows = last
        # Padding no remaining row needs is dropped for free: attention then reads fewer columns.
        self.start = self.end - max(self.lengths, default=0)
        if self.rows == 0:
            self.start = self.end = 0
        return moves
