"""Bookkeeping of the KV block pool: which blocks each sequence holds, shared full blocks, and what is free.

A block holds `block_size` tokens' keys and values in every layer (the tensors live in `kv_cache.KvBlockPool`;
this module never touches them). A full block that has been computed is keyed by a digest (BLAKE2b) of its parent
block's key, its own tokens and, for a first block, the request's cache salt, so a later prompt that starts with
the same tokens under the same salt reuses it instead of prefilling them again (prefix caching); requests with
different salts (vLLM's `cache_salt`) never share a block, nor learn from the reuse counts what the others cached.
A key only finds a candidate: a hit also needs the candidate's own tokens and salt to match and its parent to be
the very block (id and allocation) matched just before, so even a digest collision never hands one client
another's keys and values. Blocks are reference counted: a shared block is freed only when its last holder lets
go; a freed block that carries a key stays findable until the pool runs out of blank blocks, and then the least
recently used of them is evicted (its key forgotten, its memory handed out again).

A sequence gets at admission the blocks its tokens need now (`allocate`), and one more each time its decoding
crosses a block boundary (`grow`). When `grow` finds the pool empty the scheduler preempts a sequence (frees its
blocks; it is recomputed later): nothing is reserved for what a request may generate one day.

Block 0 is never handed out: padding tokens of a step write there (a dump that keeps the writes branch-free and
the step's shapes static).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

TRASH_BLOCK = 0


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    key: bytes | None = None  # set while it is findable
    # What `key` stands for, checked on a match (a digest can collide): its tokens, its salt, and its parent block
    # as (id, allocation) when it was registered (None: the sequence's first block).
    token_ids: tuple[int, ...] = ()
    salt: str | None = None
    parent: tuple[int, int] | None = None
    allocation: int = 0  # counts the times it was handed out: (id, allocation) names one content


@dataclass(slots=True)
class BlockTable:
    """One sequence's blocks, in order of position, and what its admission found."""

    block_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens whose keys and values were found in the pool (not prefilled)
    reused_blocks: int = 0
    missed_blocks: int = 0  # full prompt blocks looked up and not found
    new_blocks: int = 0  # blocks allocated for it (not reused)
    hashed_blocks: int = 0  # leading blocks whose key is known (registered or reused)
    last_key: bytes | None = None  # key of block `hashed_blocks - 1`
    salt: str | None = None  # the request's cache salt: only blocks of the same salt are shared


def block_key(parent_key: bytes | None, tokens: tuple[int, ...], salt: str | None) -> bytes:
    """The key of a full block: a digest of its tokens and (through `parent_key`, or the salt for a first block)
    every token and the salt before it."""
    digest = hashlib.blake2b(digest_size=16)
    if parent_key is None:
        digest.update(b"salt:" + salt.encode("utf-8", "surrogatepass") if salt is not None else b"nosalt")
    else:
        digest.update(parent_key)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_reuse: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one usable block, got {num_blocks}")
        self.block_size = block_size
        self.enable_reuse = enable_reuse
        self.blocks = [Block(i) for i in range(num_blocks + 1)]  # + the trash block
        # Blank free blocks, a stack: the most recently freed is used first, and never-used ones in id order, so
        # memory pages are touched only as the load needs them (`kv_cache.KvBlockPool` on the CPU).
        self._blank: list[int] = list(range(num_blocks, TRASH_BLOCK, -1))
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free blocks with a key, least recent first
        self._by_key: dict[bytes, int] = {}
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
        """Blocks no sequence holds (cached free blocks count: they can be evicted)."""
        return len(self._blank) + len(self._cached_free)

    @property
    def cached_free_blocks(self) -> int:
        return len(self._cached_free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -- admission -------------------------------------------------------------------------------------------------
    def _prefix_matches(self, token_ids: list[int], prompt_len: int, salt: str | None) -> list[tuple[int, bytes]]:
        """(block id, key) of the leading prompt blocks found in the pool, each the child of the one before. The last
        prompt token is never taken from the cache, so the prefill computes at least one token and has logits."""
        matches: list[tuple[int, bytes]] = []
        if not self.enable_reuse:
            return matches
        key, parent = None, None
        for index in range((prompt_len - 1) // self.block_size):
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            key = block_key(key, tokens, salt)
            block = self.blocks[self._by_key.get(key, TRASH_BLOCK)]
            if block.key != key or block.token_ids != tokens or block.salt != salt or block.parent != parent:
                break
            matches.append((block.block_id, key))
            parent = (block.block_id, block.allocation)
        return matches

    def allocate(
        self, token_ids: list[int], prompt_len: int, salt: str | None = None, spare_blocks: int = 0, reuse: bool = True
    ) -> BlockTable | None:
        """Blocks for the first `prompt_len` tokens (shared where cached under the same salt, unless not `reuse`); None
        when the pool cannot hold them and still keep `spare_blocks` free (nothing changes then)."""
        matches = self._prefix_matches(token_ids, prompt_len, salt) if reuse else []
        total = self.blocks_for(prompt_len)
        revived = sum(1 for block_id, _ in matches if self.blocks[block_id].ref_count == 0)
        if total - len(matches) + revived + spare_blocks > self.free_blocks:
            return None
        table = BlockTable(salt=salt)
        for block_id, key in matches:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._cached_free[block_id]
            block.ref_count += 1
            table.block_ids.append(block_id)
            table.last_key = key
        table.hashed_blocks = table.reused_blocks = len(matches)
        table.cached_tokens = len(matches) * self.block_size
        if self.enable_reuse:
            table.missed_blocks = prompt_len // self.block_size - len(matches)
        for _ in range(total - len(matches)):
            self._draw(table)
        self.total_reused += table.reused_blocks
        self.total_missed += table.missed_blocks
        return table

    # -- while running ---------------------------------------------------------------------------------------------
    def grow(self, table: BlockTable, tokens: int) -> bool:
        """Blocks for the first `tokens` positions; False when the pool ran out first."""
        while len(table.block_ids) * self.block_size < tokens:
            if not self.free_blocks:
                return False
            self._draw(table)
        return True

    def register_full_blocks(self, table: BlockTable, token_ids: list[int], computed_tokens: int) -> None:
        """Make the full blocks among the first `computed_tokens` positions (their keys and values written) findable
        by later prompts."""
        if not self.enable_reuse:
            return
        while (table.hashed_blocks + 1) * self.block_size <= computed_tokens:
            index = table.hashed_blocks
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            key = block_key(table.last_key, tokens, table.salt)
            block = self.blocks[table.block_ids[index]]
            if block.key is None and key not in self._by_key:
                parent = None
                if index:
                    before = self.blocks[table.block_ids[index - 1]]
                    parent = (before.block_id, before.allocation)
                block.key, block.token_ids, block.salt, block.parent = key, tokens, table.salt, parent
                self._by_key[key] = block.block_id
            # else: the key is taken (the same tokens cached in another block, computed side by side, or a
            # collision); this copy stays private and goes back blank.
            table.hashed_blocks += 1
            table.last_key = key

    def free(self, table: BlockTable) -> None:
        """Let go of a sequence's blocks (idempotent)."""
        # Last blocks first: in the LRU a chain's tail is then evicted before its head, which later prompts need.
        for block_id in reversed(table.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.key is not None:
                    self._cached_free[block_id] = None
                else:
                    self._blank.append(block_id)
        table.block_ids = []

    def _draw(self, table: BlockTable) -> None:
        if self._blank:
            block_id = self._blank.pop()
        else:  # no blank block left: evict the least recently used cached one
            block_id, _ = self._cached_free.popitem(last=False)
            block = self.blocks[block_id]
            del self._by_key[block.key]
            block.key, block.token_ids, block.salt, block.parent = None, (), None, None
            self.total_evicted += 1
        block = self.blocks[block_id]
        block.ref_count = 1
        block.allocation += 1
        table.block_ids.append(block_id)
        table.new_blocks += 1
