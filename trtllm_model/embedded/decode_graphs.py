"""CUDA graphs of the runner's decode steps (`runner.ModelRunner` with `cuda_graphs`), one graph a bucket.

With static shapes the runner pads a decode step to a bucket (rows and table width, powers of two) and copies its
inputs in place into tensors kept per bucket: the shapes and addresses a graph replays. Each bucket's decode forward
is captured on its first use, or before the first request (`DecodeGraphs.capture`), after a warm-up on a side stream
(the buckets share one private memory pool) and replayed after, the logits read from the graph's static output.
`decode_greedy`'s steps of a bucket are one graph of their own, their tokens read from its static output.

Beyond the power-of-two buckets (the many prompt tokens of a burst of new requests, taken as rows of a decode step)
rows pad to `fused_forward.padded_count` sizes and the head runs over each sequence's last row only (`JoinedBuckets`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import fused_forward
from .kv_cache import StepInputs

log = logging.getLogger(__name__)


# GPU memory a bucket's capture leaves free beyond its estimated peak (the estimate is rough).
GRAPH_MEMORY_MARGIN_BYTES = 256 << 20
# The context a row of a step beyond the power-of-two buckets may have (`JoinedBuckets.width`): each prompt token
# attends as a decode row over its own keys (the paged decode kernel), which suits chat prompts; longer chunks go to
# a prompt forward of their own, whose attention is SDPA's.
JOINED_CONTEXT_TOKENS = 512


@dataclass(frozen=True, slots=True)
class JoinedBuckets:
    """Decode steps of more rows than the power-of-two buckets (`above`), as a burst of new requests' prompt tokens
    make: rows pad to `fused_forward.padded_count` sizes (at most 12.5 % more, where a power of two could double a
    step's matmuls), every table is `width` blocks wide (one graph a size), and the head runs over `head_rows`
    rows, each sequence's last (a step holds at most that many sequences), not over every prompt token."""

    above: int
    width: int
    head_rows: int


class DecodeGraphs:
    """The runner's decode graphs: captured on first use (or all at once, `capture`) and replayed. What they run and
    read is the runner's: its forwards (`_forward`, `_greedy_steps`), its bucket tensors (`_static_copy`,
    `_padding_inputs`) and its KV pool."""

    def __init__(self, runner: Any) -> None:  # a `runner.ModelRunner`, untyped here: runner.py imports this module
        self.runner = runner
        # (rows, width) -> (graph, logits): a bucket's decode forward
        self.forwards: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # (rows, width, steps) -> (graph, [steps, rows] tokens): `decode_greedy`'s steps as one graph
        self.greedy: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.memory_pool = None
        self.max_rows = 0  # rows of the largest bucket a decode step may take (capture)
        self.joined: JoinedBuckets | None = None  # the buckets beyond the powers of two (capture)
        self.eager_buckets: set[tuple[int, int]] = set()  # not captured: the GPU memory left was too little

    def clear(self) -> None:
        """Forget the graphs: they captured the old pool's addresses (`allocate_kv_pool`)."""
        self.forwards.clear()
        self.greedy.clear()
        self.eager_buckets.clear()

    def capture(self, max_rows: int, greedy_steps: int = 1, greedy_rows: int = 0, step_rows: int = 0) -> int:
        """With `cuda_graphs`, capture every decode bucket up to `max_rows` rows (decoding sequences and prompt
        tokens prefilled in the same forward, see `ModelRunner.decode`) whose rows x width fits the pool's blocks,
        largest first (the graphs share one memory pool), so no request waits for a capture. A bucket whose forward
        would not fit in the GPU memory left beside the pool is not captured: it runs eagerly (`logits`). A bucket
        beyond these (possible with shared prefixes) is captured on first use. With `greedy_steps` > 1, the buckets of
        up to `greedy_rows` rows (the most sequences a step holds) also get `decode_greedy`'s graph of that many
        steps. With fused forwards and `step_rows` (the most rows a step has: max_num_tokens) beyond those buckets, the
        joined buckets up to it (`JoinedBuckets`). Returns how many were captured."""
        runner = self.runner
        if not runner.cuda_graphs:
            return 0
        reserved = [torch.cuda.memory_reserved(runner.device)]  # before, after the powers of two, after joined ones
        most = runner.max_blocks_per_sequence
        buckets = power_buckets(max_rows, most, runner.pool.num_blocks)
        for rows, width in sorted(buckets, key=lambda size: -size[0] * size[1]):
            inputs = runner._static_copy(runner._padding_inputs(rows, width))
            self.logits(inputs)
            if greedy_steps > 1 and rows <= bucket(greedy_rows):
                zeros = torch.zeros((2, rows), dtype=torch.long, device=runner.device)
                ban = runner._greedy_bans.setdefault(rows, zeros)
                self.tokens(inputs, ban, greedy_steps)
        self.max_rows = max((rows for rows, _ in self.forwards), default=0)
        reserved.append(torch.cuda.memory_reserved(runner.device))
        if runner.fused_forward is not None and step_rows > self.max_rows:
            width = min(bucket(-(-JOINED_CONTEXT_TOKENS // runner.pool.block_size)), most)
            self.joined = JoinedBuckets(self.max_rows, width, bucket(greedy_rows or max_rows))
            joined = [rows for rows in fused_forward.padded_counts(step_rows) if rows > self.joined.above]
            for rows in reversed(joined):
                ends = runner._static_ends.setdefault((rows, width), torch.zeros(
                    self.joined.head_rows, dtype=torch.long, device=runner.device))
                self.logits(runner._static_copy(runner._padding_inputs(rows, width)), ends)
                buckets.append((rows, width))
            self.max_rows = max(self.max_rows, *(rows for rows, _ in self.forwards))
        reserved.append(torch.cuda.memory_reserved(runner.device))
        # What the graphs' memory pool, their warm-ups and the buckets' input tensors took from the GPU: memory the
        # KV pool's budget (kv_cache_free_gpu_mem_fraction) must leave free.
        powers, joined_buckets = reserved[1] - reserved[0], reserved[2] - reserved[1]
        log.info("decode graphs reserved %.0f MiB of GPU memory (power-of-two buckets %.0f MiB, joined buckets %.0f "
                 "MiB)", (powers + joined_buckets) / 2**20, powers / 2**20, joined_buckets / 2**20)
        if self.eager_buckets:
            log.warning("%d of %d decode buckets run eagerly: their forward does not fit in the GPU memory left "
                        "beside the KV pool (lower kv_cache_free_gpu_mem_fraction to capture them)",
                        len(self.eager_buckets), len(buckets))
        return len(self.forwards) + len(self.greedy)

    def takes(self, rows: int, width: int) -> bool:
        """Whether a decode step of `rows` rows (decoding sequences and prompt tokens) whose widest table has `width`
        blocks has a graph bucket: up to `max_rows` rows, and beyond the power-of-two buckets at most
        `JoinedBuckets.width` blocks."""
        return rows <= self.max_rows and (self.joined is None or rows <= self.joined.above
                                          or width <= self.joined.width)

    def fits_beside_pool(self, rows: int, width: int, head_rows: int) -> bool:
        """Whether a decode forward of this bucket fits in the GPU memory free now (an estimate of its peak: the
        gathered keys and values, twice, unless the paged kernel reads them in the pool; the logits of its
        `head_rows` in both dtypes, the layer activations), with a margin."""
        runner = self.runner
        in_place = runner.fused_forward is not None and runner.fused_forward.decode_attention is not None
        gathered = 0 if in_place else (
            2 * rows * width * runner.pool.block_size * runner.num_kv_heads * runner.head_dim * runner.dtype.itemsize)
        config = runner.model.config
        activations = rows * (config.hidden_size + 2 * getattr(config, "intermediate_size", 0)) * 4 * 4
        need = 2 * gathered + head_rows * runner.vocab_size * (runner.dtype.itemsize + 8) + activations
        free, _ = torch.cuda.mem_get_info(runner.device)
        cached = torch.cuda.memory_reserved(runner.device) - torch.cuda.memory_allocated(runner.device)
        return need + GRAPH_MEMORY_MARGIN_BYTES <= free + cached

    def logits(self, inputs: StepInputs, ends: torch.Tensor | None = None) -> torch.Tensor:
        """The decode forward of `inputs`' bucket replayed (captured first if new); the graph's own logits tensor.
        `ends`: a joined bucket's head rows (its own static tensor)."""
        key = tuple(inputs.block_tables.shape)
        captured = self.forwards.get(key)
        if captured is None:
            head_rows = key[0] if ends is None else ends.shape[0]
            if key in self.eager_buckets or not self.fits_beside_pool(*key, head_rows):
                self.eager_buckets.add(key)
                return self.runner._forward(inputs, ends=ends)
            captured = self.forwards[key] = self._capture(inputs, lambda: self.runner._forward(inputs, ends=ends))
        graph, logits = captured
        graph.replay()
        return logits

    def tokens(self, inputs: StepInputs, ban: torch.Tensor, steps: int) -> torch.Tensor:
        """`_greedy_steps` of `inputs`' bucket replayed as one graph (captured first if new); the graph's own tokens
        tensor. A bucket too large to capture runs eagerly."""
        key = (*inputs.block_tables.shape, steps)
        captured = self.greedy.get(key)
        if captured is None:
            if key[:2] in self.eager_buckets or not self.fits_beside_pool(*key[:2], key[0]):
                self.eager_buckets.add(key[:2])
                return self.runner._greedy_steps(inputs, ban, steps)
            captured = self.greedy[key] = self._capture(inputs, lambda: self.runner._greedy_steps(inputs, ban, steps))
        graph, tokens = captured
        graph.replay()
        return tokens

    def _capture(
        self, inputs: StepInputs, run: Callable[[], torch.Tensor] | None = None
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """A graph of `run` (default: the decode forward of `inputs`) and its output. Warm-up first, off the capture
        (cuBLAS handles, lazy allocations): its key and value writes are the step's own, with the step's own values,
        so running it is harmless; the inputs it advances in place (`_greedy_steps`) are put back after it."""
        device = self.runner.device
        run = run or (lambda: self.runner._forward(inputs))
        saved = [tensor.clone() for tensor in inputs.tensors()]
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            run()
        current.wait_stream(side)
        for tensor, before in zip(inputs.tensors(), saved):
            tensor.copy_(before)
        if self.memory_pool is None:
            self.memory_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory_pool, capture_error_mode="thread_local"):
            output = run()
        return graph, output


def power_buckets(max_rows: int, most_blocks: int, pool_blocks: int | None = None) -> list[tuple[int, int]]:
    """The (rows, width) buckets `capture` takes: rows and table widths in powers of two (widths up to a sequence's
    `most_blocks`, as decode() pads them), those whose rows x width the pool's `pool_blocks` can hold (None: all)."""
    widths = sorted({min(1 << n, most_blocks) for n in range(bucket(most_blocks).bit_length())})
    rows_buckets = [1 << n for n in range(bucket(max_rows).bit_length())]
    return [(rows, width) for rows in rows_buckets for width in widths
            if pool_blocks is None or rows * width <= pool_blocks]


def graph_outputs_bytes(max_rows: int, most_blocks: int, vocab_size: int, greedy_steps: int = 1, greedy_rows: int = 0,
                        step_rows: int = 0, joined: bool = False) -> int:
    """What `capture`'s graphs keep allocated in their memory pool between replays, at most: each graph's own float
    logits (`[rows, vocab]`, one tensor a bucket), the greedy graphs' tokens, and the joined buckets' head rows.
    Over a long context these outputs, not the forwards' intermediates, are most of the graphs' memory (about 200 KB
    a row for SmolLM2's vocabulary, in every one of about ten widths)."""
    row_bytes = vocab_size * 4
    buckets = power_buckets(max_rows, most_blocks)
    total = sum(rows * row_bytes for rows, _ in buckets)
    if greedy_steps > 1:
        total += sum(greedy_steps * rows * 8 for rows, _ in buckets if rows <= bucket(greedy_rows))
    if joined and step_rows > bucket(max_rows):
        head_rows = bucket(greedy_rows or max_rows)
        total += sum(head_rows * row_bytes for rows in fused_forward.padded_counts(step_rows) if rows > bucket(max_rows))
    return total


def bucket(count: int) -> int:
    """The next power of two: few distinct shapes, so few graphs to capture."""
    return 1 << max(0, count - 1).bit_length()
