"""embedded/invariant_attention.py on the CPU: a query's attention output is the same, bit for bit, whatever else is
in the call (rows, their chunk lengths, their tables' widths, the thread count), and it is attention (SDPA's
numbers to float32 rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trtllm_model.embedded import invariant_attention

BLOCK, KV_HEADS, GROUP, DIM = 16, 3, 3, 64
LENGTH = 300  # the sequence's keys


@pytest.fixture(scope="module")
def pool():
    """Keys and values of one sequence at blocks 1.. of a pool (block 0: the trash block), and its queries."""
    generator = torch.Generator().manual_seed(0)
    blocks = -(-LENGTH // BLOCK) + 1
    keys = torch.randn(blocks, BLOCK, KV_HEADS, DIM, generator=generator)
    values = torch.randn(blocks, BLOCK, KV_HEADS, DIM, generator=generator)
    queries = torch.randn(LENGTH, KV_HEADS * GROUP, DIM, generator=generator)
    return keys, values, queries


def attend(pool, rows: list[list[int]]) -> list[torch.Tensor]:
    """One call with a row per list of query positions (left-padded to the longest, as a prefill); each row's table
    covers up to its last position. Returns each real query's output `[heads x dim]`, row by row."""
    keys, values, queries = pool
    width = max(-(-(max(row) + 1) // BLOCK) for row in rows)
    count = max(len(row) for row in rows)
    tables = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), count, dtype=torch.long)
    query = torch.zeros(len(rows), count, KV_HEADS * GROUP, DIM)
    for index, row in enumerate(rows):
        used = -(-(max(row) + 1) // BLOCK)
        tables[index, :used] = torch.arange(1, used + 1)
        positions[index, count - len(row):] = torch.tensor(row)
        query[index, count - len(row):] = queries[row]
    output = invariant_attention.attention(query.reshape(-1, KV_HEADS * GROUP, DIM), keys, values, tables, positions,
                                           DIM ** -0.5).view(len(rows), count, -1)
    return [output[index, count - len(row) + i] for index, row in enumerate(rows) for i in range(len(row))]


@pytest.mark.parametrize("position", [0, 15, 63, 64, 130, 299])
def test_a_querys_output_is_bit_equal_whatever_shares_its_call(pool, position):
    reference = attend(pool, [[position]])[0]
    calls = [
        [list(range(position + 1))],  # its prompt computed whole
        [list(range(max(0, position - 20), position + 1))],  # after a cached prefix: a chunk
        [[position], [3], [290]],  # decode rows beside others (other widths)
        [list(range(10, 40)), [position], list(range(200, 209))],  # beside prompt chunks
        [[position]] * 5,
    ]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows in calls:
            outputs = attend(pool, rows)
            flat = [p for row in rows for p in row]
            for got in (outputs[i] for i, p in enumerate(flat) if p == position):
                assert torch.equal(got, reference), (threads, [len(row) for row in rows])


def test_it_is_attention(pool):
    keys, values, queries = pool
    positions = list(range(LENGTH))
    got = torch.stack(attend(pool, [positions]))
    flat_keys = keys[1:].reshape(-1, KV_HEADS, DIM)[:LENGTH].transpose(0, 1)
    flat_values = values[1:].reshape(-1, KV_HEADS, DIM)[:LENGTH].transpose(0, 1)
    expected = F.scaled_dot_product_attention(queries.transpose(0, 1), flat_keys.repeat_interleave(GROUP, 0),
                                              flat_values.repeat_interleave(GROUP, 0), is_causal=True)
    torch.testing.assert_close(got, expected.transpose(0, 1).reshape(LENGTH, -1), atol=1e-5, rtol=1e-5)


def test_rows_pad_to_a_multiple_of_four():
    assert [invariant_attention.padded_rows(n) for n in (1, 3, 4, 5, 9, 2048)] == [4, 4, 4, 8, 12, 2048]
