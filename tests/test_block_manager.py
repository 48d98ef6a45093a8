"""The KV block pool's bookkeeping: reference counts, prefix hashes over full blocks, reservations, LRU eviction.
No model: blocks are numbers here (the engine-level tests with SmolLM2 are in test_prefix_cache.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trtllm_model.embedded import block_manager as block_manager_module
from trtllm_model.embedded.block_manager import TRASH_BLOCK, BlockManager, BlockTable

BLOCK = 4


def admitted(manager: BlockManager, tokens: list[int]) -> BlockTable:
    """Allocate as the scheduler does and mark the prompt computed, as the engine does after its prefill."""
    table = manager.allocate(tokens, len(tokens))
    assert table is not None
    manager.register_full_blocks(table, tokens, len(tokens))
    return table


def test_a_shared_prefix_is_reused_and_reference_counted():
    manager = BlockManager(num_blocks=10, block_size=BLOCK)
    prompt = list(range(10))  # blocks [0-3] [4-7] and a partial [8, 9]
    first = admitted(manager, prompt)
    assert (first.reused_blocks, first.new_blocks, first.missed_blocks) == (0, 3, 2)
    assert TRASH_BLOCK not in first.block_ids and manager.free_blocks == 7

    second = admitted(manager, prompt[:8] + [50, 51, 52])
    assert second.block_ids[:2] == first.block_ids[:2] and second.block_ids[2] != first.block_ids[2]
    assert (second.reused_blocks, second.new_blocks, second.cached_tokens) == (2, 1, 8)
    assert [manager.blocks[b].ref_count for b in first.block_ids] == [2, 2, 1]

    manager.free(first)
    assert [manager.blocks[b].ref_count for b in second.block_ids] == [1, 1, 1]
    assert manager.free_blocks == 10 - 3  # first's partial block is back; the shared two are still held
    manager.free(second)
    assert manager.free_blocks == 10 and manager.cached_free_blocks == 2


def test_the_same_tokens_after_a_different_prefix_are_not_shared():
    manager = BlockManager(num_blocks=10, block_size=BLOCK)
    admitted(manager, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    other = admitted(manager, [0, 0, 0, 0, 5, 6, 7, 8, 9])  # block 2 equal, block 1 not: the chain differs
    assert other.reused_blocks == 0


def test_the_last_prompt_token_is_always_computed():
    """A prompt of exactly two full cached blocks reuses one: the prefill needs a token to give logits."""
    manager = BlockManager(num_blocks=10, block_size=BLOCK)
    prompt = list(range(8))
    admitted(manager, prompt)
    again = admitted(manager, prompt)
    assert again.reused_blocks == 1 and again.cached_tokens == 4 and again.new_blocks == 1


def test_blocks_are_findable_only_once_registered_and_reuse_can_be_off():
    manager = BlockManager(num_blocks=10, block_size=BLOCK)
    prompt = list(range(9))
    manager.allocate(prompt, len(prompt))  # admitted, not prefilled yet
    assert manager.allocate(prompt, len(prompt)).reused_blocks == 0

    off = BlockManager(num_blocks=10, block_size=BLOCK, enable_reuse=False)
    admitted(off, prompt)
    table = admitted(off, prompt)
    assert (table.reused_blocks, table.missed_blocks) == (0, 0) and off.total_reused == 0


def admitted_salted(manager: BlockManager, tokens: list[int], salt: str | None) -> BlockTable:
    table = manager.allocate(tokens, len(tokens), salt=salt)
    assert table is not None
    manager.register_full_blocks(table, tokens, len(tokens))
    return table


def test_a_digest_collision_is_not_a_match(monkeypatch):
    """Every key the same: a lookup finds a block, but its tokens differ, so nothing is handed over."""
    monkeypatch.setattr(block_manager_module, "block_key", lambda parent, tokens, salt: b"7")
    manager = BlockManager(num_blocks=10, block_size=BLOCK)
    admitted(manager, [1, 2, 3, 4, 5])
    assert admitted(manager, [9, 9, 9, 9, 5]).reused_blocks == 0
    assert admitted(manager, [1, 2, 3, 4, 6]).reused_blocks == 1  # the one real match still is one


def test_a_block_matches_only_as_the_child_of_the_block_matched_before_it(monkeypatch):
    """A digest blind to the parent (the worst collision: same tokens after another prefix): the block after [5...]
    was computed after [1...], so a prompt [7...] + the same tokens must not get it."""
    monkeypatch.setattr(block_manager_module, "block_key", lambda parent, tokens, salt: bytes(tokens))
    manager = BlockManager(num_blocks=10, block_size=BLOCK)
    first = admitted(manager, [1, 1, 1, 1, 5, 5, 5, 5, 0])
    admitted(manager, [7, 7, 7, 7, 0])
    other = admitted(manager, [7, 7, 7, 7, 5, 5, 5, 5, 0])
    assert other.reused_blocks == 1 and other.block_ids[1] != first.block_ids[1]
    # The same after the parent block was evicted and handed out again (the parent's id alone is not enough).
    manager = BlockManager(num_blocks=3, block_size=BLOCK)
    manager.free(admitted(manager, [1, 1, 1, 1, 5, 5, 5, 5, 0]))
    manager._cached_free.move_to_end(manager._by_key[bytes([5, 5, 5, 5])])  # the parent is evicted first
    manager.free(admitted(manager, [7, 7, 7, 7, 9]))  # takes the blank block, then the old parent's
    assert admitted(manager, [7, 7, 7, 7, 5, 5, 5, 5, 0]).reused_blocks == 1


def test_blocks_are_shared_only_under_the_same_cache_salt():
    manager = BlockManager(num_blocks=20, block_size=BLOCK)
    prompt = list(range(9))
    admitted_salted(manager, prompt, "alice")
    assert admitted_salted(manager, prompt, "bob").reused_blocks == 0
    assert admitted_salted(manager, prompt, None).reused_blocks == 0
    assert admitted_salted(manager, prompt, "alice").reused_blocks == 2
    assert admitted_salted(manager, prompt, None).reused_blocks == 2  # the unsalted share among themselves


def test_a_digest_blind_to_the_salt_still_keeps_salts_apart(monkeypatch):
    real = block_manager_module.block_key
    monkeypatch.setattr(block_manager_module, "block_key", lambda parent, tokens, salt: real(parent, tokens, None))
    manager = BlockManager(num_blocks=20, block_size=BLOCK)
    admitted_salted(manager, list(range(9)), "alice")
    assert admitted_salted(manager, list(range(9)), "bob").reused_blocks == 0


def test_block_keys_are_digests_of_parent_tokens_and_salt():
    key = block_manager_module.block_key
    first = key(None, (1, 2, 3, 4), None)
    assert len(first) == 16 and first == key(None, (1, 2, 3, 4), None)
    assert len({first, key(None, (1, 2, 3, 5), None), key(None, (1, 2, 3, 4), "a"), key(first, (1, 2, 3, 4), None),
                key(None, (1, 2, 3, 4), "b")}) == 5


def test_admission_takes_what_the_prompt_needs_and_decoding_grows_until_the_pool_is_out():
    manager = BlockManager(num_blocks=4, block_size=BLOCK)
    table = admitted(manager, [1, 2, 3])  # one block now, nothing set aside for what it may generate
    assert len(table.block_ids) == 1 and manager.free_blocks == 3
    assert manager.allocate([5, 6, 7], 3, spare_blocks=3) is None and manager.free_blocks == 3  # keeps 3 spare
    assert manager.grow(table, 16) and len(table.block_ids) == 4 and manager.free_blocks == 0
    assert not manager.grow(table, 17) and len(table.block_ids) == 4
    manager.free(table)
    assert manager.free_blocks == 4


def test_free_cached_blocks_are_evicted_least_recently_used_only_when_blank_ones_run_out():
    manager = BlockManager(num_blocks=4, block_size=BLOCK)
    old = admitted(manager, [1] * 5)  # one full block + one partial
    new = admitted(manager, [2] * 5)
    manager.free(old)
    manager.free(new)
    assert manager.cached_free_blocks == 2 and manager.free_blocks == 4
    blank = admitted(manager, [3, 3])  # a blank block is used first: both cached blocks stay
    assert manager.cached_free_blocks == 2
    evicting = admitted(manager, [4, 4, 4, 4, 4, 4, 4])  # two blocks: the last blank one, then the oldest cached
    assert manager.cached_free_blocks == 1
    manager.free(blank)
    manager.free(evicting)
    assert admitted(manager, [2] * 5).reused_blocks == 1  # the newer survived
    assert admitted(manager, [1] * 5).reused_blocks == 0  # the older was evicted


def test_a_held_block_is_never_evicted():
    manager = BlockManager(num_blocks=3, block_size=BLOCK)
    holder = admitted(manager, [1] * 5)
    assert manager.allocate([2] * 9, 9) is None  # 3 blocks, 1 free: the held ones are not candidates
    assert [manager.blocks[b].ref_count for b in holder.block_ids] == [1, 1]
    sharer = admitted(manager, [1] * 4 + [7])  # shares the held full block, needs one more
    assert sharer.block_ids[0] == holder.block_ids[0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "grow", "free"]), st.integers(0, 7), st.integers(1, 14)),
                max_size=60))
def test_counts_stay_consistent_under_any_sequence_of_operations(operations):
    """Reference counts equal the tables holding a block; free + held = the pool; a cached key points at
    a block with exactly its tokens; no block is in two free lists or held and free at once."""
    manager = BlockManager(num_blocks=12, block_size=BLOCK)
    tables: list[tuple[BlockTable, list[int], int]] = []  # table, its tokens, its lifetime
    for kind, pick, size in operations:
        if kind == "add":
            tokens = [pick % 3] * 4 + [pick] * size  # prompts that share, or not, a first block
            table = manager.allocate(tokens, len(tokens))
            if table is not None:
                manager.register_full_blocks(table, tokens, len(tokens))
                tables.append((table, tokens, len(tokens) + 6))
        elif tables and kind == "grow":
            table, tokens, life = tables[pick % len(tables)]
            if len(tokens) < life:
                tokens.append(pick)
                if not manager.grow(table, len(tokens)):
                    tokens.pop()  # the pool is out of blocks (the scheduler would preempt someone)
                manager.register_full_blocks(table, tokens, len(tokens) - 1)
        elif tables:
            table, _, _ = tables.pop(pick % len(tables))
            manager.free(table)
        holders: dict[int, int] = {}
        for table, _, _ in tables:
            for block_id in table.block_ids:
                holders[block_id] = holders.get(block_id, 0) + 1
        for block in manager.blocks[1:]:
            assert block.ref_count == holders.get(block.block_id, 0)
        free_ids = list(manager._blank) + list(manager._cached_free)
        assert len(set(free_ids)) == len(free_ids) and not set(free_ids) & set(holders)
        assert TRASH_BLOCK not in free_ids and TRASH_BLOCK not in holders
        assert len(free_ids) + len(holders) == manager.num_blocks and manager.free_blocks == len(free_ids)
        assert manager.free_blocks >= 0
        for key, block_id in manager._by_key.items():
            assert manager.blocks[block_id].key == key and len(manager.blocks[block_id].token_ids) == BLOCK
