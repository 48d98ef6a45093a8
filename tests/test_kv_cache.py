"""The batch KV cache keeps every row's tokens right-aligned and masked correctly as rows join and leave."""

from __future__ import annotations

import torch

from trtllm_model.embedded.kv_cache import BatchKVCache


def new_cache() -> BatchKVCache:
    return BatchKVCache(num_layers=2, num_kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))


def prefilled(labels: list[int], lengths: list[int]) -> BatchKVCache:
    """A prefilled group whose token t of row r has key value label*100 + t (padding: -1)."""
    cache = new_cache()
    cache.begin_prefill(lengths)
    span = max(lengths)
    keys = torch.full((len(lengths), 1, span, 2), -1.0)
    for row, (label, length) in enumerate(zip(labels, lengths)):
        keys[row, 0, span - length :, :] = (label * 100 + torch.arange(length, dtype=torch.float32))[:, None]
    for layer in range(2):
        cache.update(keys, keys, layer)
    cache.finish_prefill(lengths)
    return cache


def decode(cache: BatchKVCache, labels: list[int]) -> None:
    cache.reserve(1)
    keys = torch.tensor([label * 100 + length for label, length in zip(labels, cache.lengths)], dtype=torch.float32)
    keys = keys[:, None, None, None].expand(-1, 1, 1, 2)
    for layer in range(2):
        cache.update(keys, keys, layer)
    cache.advance(1)


def real_tokens(cache: BatchKVCache) -> list[list[int]]:
    keys = cache.layers[1].keys[: cache.rows, 0, cache.start : cache.end, 0]
    return [[int(v) for v in keys[row, cache.span - length :]] for row, length in enumerate(cache.lengths)]


def expected(labels: list[int], lengths: list[int]) -> list[list[int]]:
    return [[label * 100 + t for t in range(length)] for label, length in zip(labels, lengths)]


def test_rows_join_decode_and_leave():
    cache = new_cache()
    labels: list[int] = []
    cache.append_rows(prefilled([1, 2], [3, 5]))
    labels += [1, 2]
    decode(cache, labels)
    cache.append_rows(prefilled([3], [9]))  # longer than the batch: every row gains left padding
    labels += [3]
    for _ in range(20):  # past the first column capacity: the buffer grows
        decode(cache, labels)
    assert real_tokens(cache) == expected(labels, [24, 26, 29])

    moves = cache.remove_rows([0])  # the last row fills the hole
    assert moves == [(2, 0)]
    labels = [3, 2]
    assert real_tokens(cache) == expected(labels, [29, 26])
    cache.remove_rows([0])
    labels = [2]
    assert cache.span == 26  # padding nobody needs is dropped
    cache.append_rows(prefilled([4, 5], [2, 4]))
    labels += [4, 5]
    decode(cache, labels)
    assert real_tokens(cache) == expected(labels, [27, 3, 5])

    mask = cache.decode_mask()[:, 0, 0, :]
    assert mask.shape == (3, cache.span + 1)
    assert mask.sum(dim=1).tolist() == [28, 4, 6]  # real tokens plus the new one
    assert mask[:, -1].all() and not mask[1, 0]

    cache.remove_rows([0, 1, 2])
    assert cache.rows == 0 and cache.span == 0


def test_prefill_mask_is_causal_and_never_empty():
    cache = new_cache()
    cache.begin_prefill([2, 4])
    mask = cache.prefill_mask([2, 4])[:, 0]
    assert mask.shape == (2, 4, 4)
    assert mask[1].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    # Row 0 is padded by two: its real queries see only real keys; padding queries see themselves.
    assert mask[0, 3].tolist() == [False, False, True, True]
    assert mask[0, 0].tolist() == [True, False, False, False]
    assert mask.any(dim=-1).all()
