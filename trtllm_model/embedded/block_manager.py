"""Bookkeeping of the KV block pool: which blocks each sequence holds, shared full blocks, and what is free.

A block holds `block_size` tokens' keys and values in every layer (the tensors live in `kv_cache.KvBlockPool`;
this module never touches them). A full block that has been computed is keyed by a hash chained over the prefix
before it and its own tokens, so a later prompt that starts with the same tokens reuses it instead of prefilling
them again (prefix caching). Blocks are reference counted: a shared block is freed only when its last holder
lets go; a freed block that carries a hash stays findable until the pool runs out of blank blocks, and then the
least recently used of them is evicted (its hash forgotten, its memory handed out again).

A sequence reserves at admission every block it can ever need (prompt + max_tokens): the engine has no
preemption, so a running sequence must never find the pool empty. Blocks it will fill while decoding are drawn
from that reservation.

Block 0 is never handed out: padding tokens of a step write there (a dump that keeps the writes branch-free and
the step's shapes static).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

TRASH_BLOCK = 0


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()  # what `hash` stands for, checked on a match (hashes can collide)


@dataclass(slots=True)
class BlockTable:
    """One sequence's blocks, in order of position, and what its admission found."""

    block_ids: list[int] = field(default_factory=list)
    reserved: int = 0  # blocks it may still draw for decoding
    cached_tokens: int = 0  # prompt tokens whose keys and values were found in the pool (not prefilled)
    reused_blocks: int = 0
    missed_blocks: int = 0  # full prompt blocks looked up and not found
    new_blocks: int = 0  # blocks allocated for it (not reused)
    hashed_blocks: int = 0  # leading blocks whose hash is known (registered or reused)
    last_hash: int | None = None  # hash of block `hashed_blocks - 1`


def chain_hash(prefix_hash: int | None, tokens: tuple[int, ...]) -> int:
    """The key of a full block: its tokens and (through `prefix_hash`) every token before it."""
    return hash((prefix_hash, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_reuse: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one usable block, got {num_blocks}")
        self.block_size = block_size
        self.enable_reuse = enable_reuse
        self.blocks = [Block(i) for i in range(num_blocks + 1)]  # + the trash block
        # Blank free blocks, a stack: the most recently freed is used first, and never-used ones in id order, so
        # memory pages are touched only as the load needs them (`high_water` says how far).
        self._blank: list[int] = list(range(num_blocks, TRASH_BLOCK, -1))
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free blocks with a hash, least recent first
        self._by_hash: dict[int, int] = {}
        self._reserved = 0  # blocks promised to running sequences, not drawn yet
        self.high_water = 1  # blocks [0, high_water) have been handed out at least once
        # Totals since start (TensorRT-LLM's KvCacheStats counts the same way).
        self.total_reused = 0
        self.total_missed = 0
        self.total_evicted = 0

    # -- sizes -----------------------------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def free_blocks(self) -> int:
        """Blocks no running sequence holds or has reserved (cached free blocks count: they can be evicted)."""
        return len(self._blank) + len(self._cached_free) - self._reserved

    @property
    def cached_free_blocks(self) -> int:
        return len(self._cached_free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -- admission -------------------------------------------------------------------------------------------------
    def _prefix_matches(self, token_ids: list[int], prompt_len: int) -> list[tuple[int, int]]:
        """(block id, hash) of the leading prompt blocks found in the pool. The last prompt token is never taken from
        the cache, so the prefill computes at least one token and has logits to sample from."""
        matches: list[tuple[int, int]] = []
        if not self.enable_reuse:
            return matches
        prefix_hash = None
        for index in range((prompt_len - 1) // self.block_size):
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            prefix_hash = chain_hash(prefix_hash, tokens)
            block_id = self._by_hash.get(prefix_hash)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            matches.append((block_id, prefix_hash))
        return matches

    def allocate(
        self, token_ids: list[int], prompt_len: int, lifetime_tokens: int, max_prefill_tokens: int | None = None
    ) -> BlockTable | None:
        """Blocks for a prompt (shared where cached) plus a reservation up to `lifetime_tokens`; None when the pool
        cannot hold it now, or its uncached rest is over `max_prefill_tokens` (nothing changes then)."""
        matches = self._prefix_matches(token_ids, prompt_len)
        if max_prefill_tokens is not None and prompt_len - len(matches) * self.block_size > max_prefill_tokens:
            return None
        total = self.blocks_for(lifetime_tokens)
        revived = sum(1 for block_id, _ in matches if self.blocks[block_id].ref_count == 0)
        if total - len(matches) + revived > self.free_blocks:
            return None
        table = BlockTable()
        for block_id, block_hash in matches:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._cached_free[block_id]
            block.ref_count += 1
            table.block_ids.append(block_id)
            table.last_hash = block_hash
        table.hashed_blocks = table.reused_blocks = len(matches)
        table.cached_tokens = len(matches) * self.block_size
        if self.enable_reuse:
            table.missed_blocks = prompt_len // self.block_size - len(matches)
        self._reserved += total - len(matches)
        table.reserved = total - len(matches)
        for _ in range(self.blocks_for(prompt_len) - len(matches)):
            self._draw(table)
        self.total_reused += table.reused_blocks
        self.total_missed += table.missed_blocks
        return table

    def can_ever_fit(self, lifetime_tokens: int) -> bool:
        return self.blocks_for(lifetime_tokens) <= self.num_blocks

    # -- while running ---------------------------------------------------------------------------------------------
    def ensure_slots(self, table: BlockTable, tokens: int) -> None:
        """Blocks for the first `tokens` positions (drawn from the reservation)."""
        while len(table.block_ids) * self.block_size < tokens:
            self._draw(table)

    def register_full_blocks(self, table: BlockTable, token_ids: list[int], computed_tokens: int) -> None:
        """Make the full blocks among the first `computed_tokens` positions (their keys and values written) findable
        by later prompts."""
        if not self.enable_reuse:
            return
        while (table.hashed_blocks + 1) * self.block_size <= computed_tokens:
            index = table.hashed_blocks
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            block_hash = chain_hash(table.last_hash, tokens)
            block = self.blocks[table.block_ids[index]]
            if block.hash is None and block_hash not in self._by_hash:
                block.hash, block.token_ids = block_hash, tokens
                self._by_hash[block_hash] = block.block_id
            # else: the same tokens are already cached in another block (computed side by side); this copy stays
            # private and goes back blank.
            table.hashed_blocks += 1
            table.last_hash = block_hash

    def free(self, table: BlockTable) -> None:
        """Let go of a sequence's blocks and what is left of its reservation (idempotent)."""
        self._reserved -= table.reserved
        table.reserved = 0
        # Last blocks first: in the LRU a chain's tail is then evicted before its head, which later prompts need.
        for block_id in reversed(table.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None:
                    self._cached_free[block_id] = None
                else:
                    self._blank.append(block_id)
        table.block_ids = []

    def _draw(self, table: BlockTable) -> None:
        assert table.reserved > 0, "a sequence drew more blocks than it reserved"
        table.reserved -= 1
        self._reserved -= 1
        if self._blank:
            block_id = self._blank.pop()
        else:  # no blank block left: evict the least recently used cached one
            block_id, _ = self._cached_free.popitem(last=False)
            block = self.blocks[block_id]
            del self._by_hash[block.hash]
            block.hash, block.token_ids = None, ()
            self.total_evicted += 1
        self.blocks[block_id].ref_count = 1
        self.high_water = max(self.high_water, block_id + 1)
        table.block_ids.append(block_id)
        table.new_blocks += 1
