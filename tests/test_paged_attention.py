"""The paged decode-attention kernel (embedded/paged_attention.py, issue 33 item 2), run here by Triton's interpreter
on CPU tensors: each row attends over its own blocks up to its position, as a float64 softmax over the gathered keys
says, whatever the blocks' order in the pool, the table's padding or the tiles a context spans; and a fused decode
forward that uses it gives the tokens and log probs of transformers' own forward, bucketed like the CUDA graphs; and a
decode bucket read in place is not refused a CUDA graph for gathered copies it does not make."""

from __future__ import annotations

import os

import pytest
import torch
from test_fused_forward import assert_same_answers, run_with, tiny_llama

from trtllm_model.embedded.block_manager import TRASH_BLOCK
from trtllm_model.embedded.decode_graphs import JoinedBuckets
from trtllm_model.embedded.fused_forward import FusedForward
from trtllm_model.embedded.runner import ModelRunner

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # tests/conftest.py, without a GPU
DEVICE = "cpu" if INTERPRETED else "cuda"


@pytest.fixture
def kernel():
    """`paged_attention`: its kernel run by Triton's interpreter on CPU tensors, or compiled on a GPU host."""
    if not INTERPRETED and not torch.cuda.is_available():
        pytest.skip("neither Triton's interpreter nor a GPU")
    from trtllm_model.embedded import paged_attention
    return paged_attention


def reference(query, keys, values, tables, positions, scale) -> torch.Tensor:
    """Each row's keys gathered through its table, cut at its position, softmax in float64: `[rows, heads x dim]`."""
    rows, heads, dim = query.shape
    kv_heads = keys.shape[2]
    out = []
    for row in range(rows):
        length = int(positions[row]) + 1
        k = keys[tables[row]].reshape(-1, kv_heads, dim)[:length].double().repeat_interleave(heads // kv_heads, 1)
        v = values[tables[row]].reshape(-1, kv_heads, dim)[:length].double().repeat_interleave(heads // kv_heads, 1)
        weights = (torch.einsum("hd,nhd->hn", query[row].double(), k) * scale).softmax(-1)
        out.append(torch.einsum("hn,nhd->hd", weights, v).reshape(-1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_each_row_attends_over_its_own_blocks_up_to_its_position(kernel, dtype, tolerance):
    generator = torch.Generator().manual_seed(7)
    blocks, block_size, kv_heads, heads, dim = 64, 16, 3, 9, 64  # SmolLM2's heads
    keys = torch.randn(blocks, block_size, kv_heads, dim, generator=generator).to(DEVICE, dtype)
    values = torch.randn(blocks, block_size, kv_heads, dim, generator=generator).to(DEVICE, dtype)
    # Positions: the first key only, a block's last and the next block's first, past one tile of 64 keys, the
    # table's last key. Blocks scattered over the pool; the table's unused entries the trash block.
    positions = torch.tensor([0, 15, 16, 70, 127, 33])
    width = 8
    tables = torch.full((len(positions), width), TRASH_BLOCK)
    scattered = (torch.randperm(blocks - 1, generator=generator) + 1).tolist()
    for row, position in enumerate(positions.tolist()):
        used = position // block_size + 1
        tables[row, :used] = torch.tensor(scattered[:used])
        scattered = scattered[used:]
    # The query as the fused forward hands it over: a slice of a wider token range.
    query = torch.randn(len(positions) + 2, heads, dim, generator=generator).to(DEVICE, dtype)[1:-1]
    tables, positions = tables.to(DEVICE), positions.to(DEVICE)
    got = kernel.decode_attention(query, keys, values, tables, positions, dim ** -0.5)
    assert got.shape == (len(positions), heads * dim) and got.dtype == dtype
    expected = reference(query, keys, values, tables, positions, dim ** -0.5)
    assert (got.double() - expected).abs().max() < tolerance, (got.double() - expected).abs().max()
    # A key past a row's position changes nothing; one at it does.
    slot = int(tables[3, 70 // block_size]) * block_size + 70 % block_size
    keys.view(-1, kv_heads, dim)[slot + 1] += 100
    assert torch.equal(kernel.decode_attention(query, keys, values, tables, positions, dim ** -0.5), got)
    keys.view(-1, kv_heads, dim)[slot] += 100
    changed = kernel.decode_attention(query, keys, values, tables, positions, dim ** -0.5)
    assert not torch.equal(changed[3], got[3]) and torch.equal(changed[[0, 1, 2, 4, 5]], got[[0, 1, 2, 4, 5]])


def test_heads_the_kernel_cannot_take_are_named(kernel):
    assert kernel.supports(9, 3, 64) and kernel.supports(32, 8, 128) and kernel.supports(4, 2, 16)
    assert not kernel.supports(9, 3, 48) and not kernel.supports(64, 2, 64) and not kernel.supports(9, 2, 64)
    with pytest.raises(ValueError, match="9 heads over 3 key-value heads of 48 is not supported"):
        kernel.decode_attention(*(tensor.to(DEVICE) for tensor in (
            torch.zeros(1, 9, 48), torch.zeros(2, 16, 3, 48), torch.zeros(2, 16, 3, 48),
            torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))), 1.0)


@pytest.mark.parametrize("joined", [None, JoinedBuckets(above=8, width=4, head_rows=8)],
                         ids=["power-of-two buckets", "joined buckets beyond 8 rows"])
def test_fused_decode_steps_through_the_kernel_give_the_tokens_and_log_probs_of_transformers_forward(kernel, joined):
    """Bucketed like the CUDA graphs (padding rows, prompts prefilled as rows of the step; beyond 8 rows, as a burst's
    prompts are: rows padded to `padded_count` sizes, the head over each sequence's last row): every single-query
    part goes through the kernel, as on CUDA. (On a GPU host tests/test_cuda_transformers.py checks the served
    tokens.)"""
    if not INTERPRETED:
        pytest.skip("the CPU engine's tensors need Triton's interpreter")
    model = tiny_llama(2)
    prompts = [[5 + 7 * i + j for j in range(3 + 9 * i)] for i in range(4)]  # up to 30 tokens: several blocks
    expected, _ = run_with(model, None, prompts, 12, None, static_shapes=True)
    fused, kernel_calls = FusedForward(model, compile=False), []
    assert fused.decode_attention is None  # on the CPU: gathered blocks and SDPA

    def counted(*args):
        kernel_calls.append(args[0].shape[0])
        return kernel.decode_attention(*args)

    fused.decode_attention = counted  # as on CUDA
    got, calls = run_with(model, None, prompts, 12, fused, static_shapes=True, joined=joined)
    assert_same_answers(got, expected, 1e-4)
    assert all(queries == 1 for shapes in calls for _, queries in shapes)
    # Beyond 8 rows the joined buckets' sizes, not only powers of two.
    uneven = [rows for shapes in calls for rows, _ in shapes if rows & (rows - 1)]
    assert bool(uneven) == (joined is not None) and all(rows > 8 for rows in uneven), calls
    assert len(kernel_calls) == 2 * len(calls)  # every layer of every forward


def test_a_decode_bucket_read_in_place_needs_no_room_for_gathered_copies(monkeypatch):
    """A CUDA graph's bucket is captured only if its forward fits beside the pool; the kernel gathers no copies, so a
    wide bucket that would not fit with them does (GPU memory faked: 600 MB free)."""
    runner = ModelRunner(tiny_llama(2), deterministic=False)  # the kernel is for decode rows unless deterministic
    runner.allocate_kv_pool(64, 16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (600 << 20, 1 << 40))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    # 256 rows x 512 blocks: 268 MB of gathered keys and values in float32, counted twice.
    assert not runner.graphs.fits_beside_pool(256, 512, 256)
    runner.fused_forward.decode_attention = lambda *args: None  # as on CUDA
    assert runner.graphs.fits_beside_pool(256, 512, 256)
