"""Forwards over the model: a prefill of what admitted prompts do not find cached, one decode step for the batch.

The runner owns the KV block pool and builds each step's inputs (`kv_cache.StepInputs`) from the sequences'
block tables. With `static_shapes` (the default on CUDA) a decode step is padded to bucketed sizes (rows and
table width, powers of two) and its inputs are copied in place into tensors kept per bucket: the shapes and
addresses a CUDA graph of the decode step replays. With `cuda_graphs` (CUDA and static shapes only) a decode step
replays its bucket's graph (`self.graphs`: decode_graphs.py captures and replays them).

A decode step may also take prompt tokens as rows of their own (`decode`'s prefills): a prompt's prefill is then a
graph replay, not an eager forward whose launches cost an H200's host 13-18 ms. Beyond the power-of-two buckets (the
many prompt tokens of a burst of new requests) rows pad to `fused_forward.padded_count` sizes and the head runs over
each sequence's last row only (`decode_graphs.JoinedBuckets`).

A decode step may feed some rows a token that is still on the device (the engine's overlapped steps), and several
greedy steps may go as one launch (`decode_greedy`: each step's argmax fed to the next on the device; on CUDA one graph
a bucket). Without static shapes (the CPU), rows whose block tables differ a lot attend apart (`padded_groups`), and
with fused forwards a step's prompt chunks share its forward (`mixes_prompts`).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import fused_forward, row_invariance
from .block_manager import TRASH_BLOCK
from .decode_graphs import DecodeGraphs, bucket
from .kv_cache import KvBlockPool, PagedCache, StepInputs
from .model_patches import use_fused_rms_norm, use_grouped_decode_attention
from .padded_groups import padded_groups
from .sequence import Sequence
from .transfers import to_device


class ModelRunner:
    """Runs a transformers causal LM's own forward against the KV block pool; returns last-position logits."""

    def __init__(
        self,
        model: torch.nn.Module,
        static_shapes: bool | None = None,
        cuda_graphs: bool = True,
        fused_forwards: bool | None = None,
        deterministic: bool | None = None,
    ) -> None:
        """`fused_forwards` None or True: for the models `fused_forward` supports (prefill and decode forwards).
        `deterministic` (None: on the CPU): a token's numbers the same whatever shares its forward (fused forwards
        only, `invariant_attention`)."""
        self.model = model
        use_grouped_decode_attention(model)
        config = model.config
        self.vocab_size: int = config.vocab_size
        self.max_positions: int = getattr(config, "max_position_embeddings", 1 << 30)
        self.num_layers: int = config.num_hidden_layers
        self.num_kv_heads: int = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        if self.device.type == "cuda":
            use_fused_rms_norm(model)  # on an H200: 1 stream 1.37x, 256 streams 1.07x (docs/performance.md)
        self.static_shapes = self.device.type == "cuda" if static_shapes is None else static_shapes
        # Compiled on CUDA; eager on the CPU, where a forward's weights read once for decode rows and a prompt's
        # chunk together is the gain (`mixes_prompts`).
        self.deterministic = self.device.type == "cpu" if deterministic is None else deterministic
        if self.deterministic and self.device.type == "cpu":
            row_invariance.ask_for_reproducible_blas()  # in time if no product ran yet (the fused forward checks)
        if self.deterministic and self.device.type == "cuda":
            # cuBLAS reads its workspace setting when its handle is made (the first product); warn_only: the
            # sampler's cumsum has no deterministic CUDA kernel and would otherwise fail the request.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.fused_forward = (fused_forward.FusedForward(model, compile=self.device.type == "cuda",
                                                         invariant=self.deterministic)
                              if fused_forwards is not False and fused_forward.supports(model) else None)
        # What a prompt forward costs beyond its padded tokens, in tokens (`scheduler.prefill_groups`). On an H200 a
        # prompt forward cost the host 13-83 ms whatever its shape, far more than its GPU time (about 1 us a padded
        # token): one forward an iteration took the 256-stream round's prompt iterations from 273-352 ms to 118-142
        # on one machine (docs/performance.md). On the CPU a forward's computation is most of its cost, and its
        # prompts' first tokens go out only once it is done: 64 kept 32 chats' TTFT p50 where it was (1.16 s; 512
        # made it 1.71 s).
        self.prefill_forward_cost_tokens: float = 4096.0 if self.device.type == "cuda" else 64.0
        self.pool: KvBlockPool | None = None
        self._static_inputs: dict[tuple[int, int], StepInputs] = {}  # (rows, width) -> that bucket's tensors
        self._static_ends: dict[tuple[int, int], torch.Tensor] = {}  # joined buckets' head rows, likewise
        self.cuda_graphs = cuda_graphs and self.static_shapes and self.device.type == "cuda"
        self.graphs = DecodeGraphs(self)  # the decode steps' CUDA graphs, with cuda_graphs (decode_graphs.py)
        self._greedy_bans: dict[int, torch.Tensor] = {}  # rows -> `[2, rows]` end ids and ban steps (static on CUDA)
        # transformers 5.x renamed `past_key_values` to `cache`; accept either.
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def attention_backends(self) -> contextlib.AbstractContextManager:
        """On CUDA, keep SDPA off cuDNN: it plans anew for every key length (measured on an H200, bfloat16: about
        1.5 ms of CPU per layer and step)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def allocate_kv_pool(self, num_blocks: int, block_size: int) -> KvBlockPool:
        """The pool of `num_blocks` usable blocks plus the trash block, allocated once."""
        self.pool = KvBlockPool(self.num_layers, num_blocks + 1, block_size, self.num_kv_heads, self.head_dim,
                                self.dtype, self.device)
        # A forward reads every weight once; a row reads its blocks' keys and values in every layer. So a forward
        # costs about as many bytes as this many blocks gathered (SmolLM2 in float32: about 730).
        weights = sum(parameter.numel() * parameter.element_size() for parameter in self.model.parameters())
        self._forward_cost_blocks = weights / (self.kv_bytes_per_token * block_size)
        self._static_inputs.clear()
        self._static_ends.clear()
        self.graphs.clear()  # they captured the old pool's addresses
        return self.pool

    # -- steps -----------------------------------------------------------------------------------------------------
    def prefill(self, sequences: list[Sequence]) -> torch.Tensor:
        """Each sequence's chunk `[num_computed, prefill_end)`, left-padded into one forward; `[n, vocab]` logits at
        each chunk's last token."""
        return self._forward(self._on_device(self._prefill_inputs(sequences)))

    def _prefill_inputs(self, sequences: list[Sequence]) -> StepInputs:
        """The chunks' tokens, left-padded to the longest, on the host."""
        block_size = self.pool.block_size
        queries = max(sequence.prefill_len for sequence in sequences)
        # Only the blocks up to each chunk's end: the keys past it are masked anyway, and a chunk of a long prompt
        # attending over the whole prompt's table cost it as much as its own tokens (CPU, 64 of 2,048 tokens).
        width = max(-(-sequence.prefill_end // block_size) for sequence in sequences)
        rows = len(sequences)
        # Built in numpy, not with torch ops per row (each one a dispatch on the host).
        ids = np.zeros((rows, queries), dtype=np.int64)
        positions = np.zeros((rows, queries), dtype=np.int64)
        tables = np.full((rows, width), TRASH_BLOCK, dtype=np.int64)
        for row, sequence in enumerate(sequences):
            start, end = sequence.num_computed, sequence.prefill_end
            used = -(-end // block_size)
            tables[row, :used] = sequence.blocks.block_ids[:used]
            ids[row, queries - (end - start) :] = sequence.token_ids[start:end]
            positions[row, queries - (end - start) :] = np.arange(start, end)
        # A padding query writes its key and value to the trash block.
        padding = np.arange(queries)[None, :] < (queries - np.array([s.prefill_len for s in sequences]))[:, None]
        slots = np.take_along_axis(tables, positions // block_size, 1) * block_size + positions % block_size
        slots[padding] = TRASH_BLOCK * block_size
        return StepInputs(*(torch.from_numpy(array) for array in (ids, positions, slots.reshape(-1), tables)))

    def decode(
        self, sequences: list[Sequence], prefills: list[Sequence] = (), fed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`[len(sequences) + len(prefills), vocab]` logits: each decoding sequence's next token's, then each prompt
        chunk's last token's (see `_decode_rows`). Without static shapes (the CPU) rows whose block tables differ a
        lot attend apart (`padded_groups`): one sequence with a long context no longer makes every row of the step
        read its width (CPU, 16 streams beside a 2,048-token context: 1.0 s for the step instead of about 0.1 s).
        With `mixes_prompts` those groups and the prompts' chunks (left-padded, as `prefill`) share one forward;
        else each group is a forward of its own."""
        if self.static_shapes:
            return self._decode_rows(sequences, prefills, fed)
        groups = (padded_groups([len(s.blocks.block_ids) for s in sequences], self._forward_cost_blocks)
                  if len(sequences) > 1 else [list(range(len(sequences)))])
        if self.mixes_prompts:
            parts = [self._decode_inputs([sequences[r] for r in rows], (), fed)[0] for rows in groups if rows]
            if prefills:
                parts.append(self._on_device(self._prefill_inputs(prefills)))
            logits = self._forward(*parts)
            order = [row for rows in groups for row in rows]
            if order == sorted(order):
                return logits
            rows = [*np.argsort(order).tolist(), *range(len(sequences), len(sequences) + len(prefills))]
            return logits[to_device(rows, self.device, torch.long)]
        if prefills or len(groups) == 1:
            return self._decode_rows(sequences, prefills, fed)
        logits = torch.empty((len(sequences), self.vocab_size), dtype=torch.float32, device=self.device)
        for rows in groups:
            logits[to_device(rows, self.device, torch.long)] = self._decode_rows([sequences[r] for r in rows], (), fed)
        return logits

    def decode_greedy(
        self, sequences: list[Sequence], fed: torch.Tensor | None, steps: int, end_ids: list[int], bans: list[int]
    ) -> torch.Tensor:
        """`[steps, len(sequences)]` greedy tokens: `steps` decode steps of the rows, each fed the last one's argmax
        on the device, row i's end id `end_ids[i]` banned in its first `bans[i]` steps (min_tokens). The inputs are
        built once (as `decode`'s) and advanced on the device; with CUDA graphs the steps replay as one graph (its
        tokens tensor: read or copy it before the next replay). Each row's blocks must cover its last step's
        position."""
        inputs, _, _ = self._decode_inputs(sequences, (), fed)
        rows = inputs.input_ids.shape[0]
        host = np.zeros((2, rows), dtype=np.int64)  # padding rows: end id 0, never banned
        host[0, : len(sequences)], host[1, : len(sequences)] = end_ids, bans
        ban = self._greedy_bans.get(rows)
        if ban is None or not self.static_shapes:
            ban = self._greedy_bans[rows] = torch.empty((2, rows), dtype=torch.long, device=self.device)
        ban.copy_(_pinned(torch.from_numpy(host), self.device), non_blocking=True)
        run = self.graphs.tokens if self.cuda_graphs else self._greedy_steps
        return run(inputs, ban, steps)[:, : len(sequences)]

    def _greedy_steps(self, inputs: StepInputs, ban: torch.Tensor, steps: int) -> torch.Tensor:
        """`[steps, rows]`: the decode forward of `inputs` `steps` times, each step's argmax fed to the next one at the
        next position (its slot from the row's block table), all on the device; `inputs` are left at the last step.
        `ban`: `[2, rows]`, each row's end id and the steps it is banned in. Padding rows stay in the trash block
        (positions 0 to steps - 1)."""
        block_size = self.pool.block_size
        rows = inputs.input_ids.shape[0]
        tokens = torch.empty((steps, rows), dtype=torch.long, device=self.device)
        positions = inputs.positions[:, 0]
        end_ids = ban[0][:, None]
        for step in range(steps):
            if step:
                inputs.input_ids[:, 0] = tokens[step - 1]
                positions.add_(1)
                blocks = inputs.block_tables.gather(1, torch.div(positions, block_size, rounding_mode="floor")[:, None])
                torch.add(blocks[:, 0] * block_size, positions % block_size, out=inputs.slot_mapping)
            logits = self._forward(inputs)
            banned = logits.gather(1, end_ids).masked_fill_(ban[1][:, None] > step, -torch.inf)
            tokens[step] = logits.scatter_(1, end_ids, banned).argmax(-1)
        return tokens

    @property
    def mixes_prompts(self) -> bool:
        """Whether a decode step's forward takes prompt chunks as chunks (several queries a row) beside its decoding
        rows: fused forwards without static shapes (the CPU). A step with a chunk then reads the weights once, not
        twice (CPU: see docs/performance.md). CUDA graphs take prompts as single-query rows instead."""
        return self.fused_forward is not None and not self.static_shapes

    def _decode_rows(
        self, sequences: list[Sequence], prefills: list[Sequence] = (), fed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One forward of single-query rows: each decoding sequence's last token (its keys and values are not in the
        pool yet), then each token of `prefills`' chunks as a row of its own. A row writes its token's keys
        and values, then attends over its sequence's blocks up to its own position (within one forward every row
        writes before any row reads, so a prompt's rows see each other). `[len(sequences) + len(prefills), vocab]`
        logits: the decoding rows', then each prefill chunk's last token's."""
        inputs, keep, ends = self._decode_inputs(sequences, prefills, fed)
        if ends is not None:  # a joined bucket: the head ran over the rows to keep, in order, then padding
            logits = self.graphs.logits(inputs, ends) if self.cuda_graphs else self._forward(inputs, ends=ends)
            return logits[: len(sequences) + len(prefills)].clone()
        if self.cuda_graphs:
            # The graph's own output, which the next replay overwrites: indexing copies it, a slice would not.
            logits = self.graphs.logits(inputs)
            if keep is None:
                return logits[: len(sequences)].clone()
        else:
            logits = self._forward(inputs)
        return logits[keep] if keep is not None else logits[: len(sequences)]

    def _decode_inputs(
        self, sequences: list[Sequence], prefills: list[Sequence] = (), fed: torch.Tensor | None = None
    ) -> tuple[StepInputs, torch.Tensor | None, torch.Tensor | None]:
        """`_decode_rows`' inputs on the device (with static shapes: bucketed, in the bucket's own tensors); the
        logits rows to keep when prefill rows are among them; in a joined bucket (`decode_graphs.JoinedBuckets`)
        instead the rows the head runs over (the kept ones, then the last again as padding). A sequence with a token
        still on the device (`pending`, the engine's overlapped steps) is fed row `device_row` of `fed`, the in-flight
        step's sampled tokens, without the host reading it."""
        block_size = self.pool.block_size
        decoding = len(sequences)
        # Each decoding row feeds its last token, at position num_tokens - 1. Every step walks every row here, so each
        # row's fields are read once (host-only at 256 rows: about 0.13 ms a step, a tenth of the engine thread's).
        block_lists = [sequence.blocks.block_ids for sequence in sequences]
        lengths = np.fromiter(map(len, block_lists), np.int64, decoding)
        spans = [(s.num_computed, s.prefill_end) for s in prefills]
        rows = decoding + sum(end - start for start, end in spans)
        width = max([int(lengths.max(initial=0)), *(len(s.blocks.block_ids) for s in prefills)])
        joined = self.static_shapes and self.graphs.joined is not None and rows > self.graphs.joined.above
        if joined:
            if width > self.graphs.joined.width:
                raise ValueError(f"a decode step of {rows} rows has a table of {width} blocks; beyond "
                                 f"{self.graphs.joined.above} rows at most {self.graphs.joined.width} (takes_in_graph)")
            rows, width = fused_forward.padded_count(rows), self.graphs.joined.width
        elif self.static_shapes:
            rows, width = bucket(rows), min(bucket(width), self.max_blocks_per_sequence)
        # Padding rows: token 0 at position 0 of the trash block (their tables are all trash).
        ids = np.zeros(rows, dtype=np.int64)
        positions = np.zeros(rows, dtype=np.int64)
        tables = np.full((rows, width), TRASH_BLOCK, dtype=np.int64)
        ids[:decoding] = [sequence.token_ids[-1] for sequence in sequences]
        positions[:decoding] = [len(sequence.token_ids) + sequence.pending - 1 for sequence in sequences]
        # Every decoding row's table in one assignment, not one per row.
        tables[:decoding][np.arange(width) < lengths[:, None]] = np.fromiter(
            itertools.chain.from_iterable(block_lists), np.int64, int(lengths.sum()))
        row = decoding
        for sequence, (start, end) in zip(prefills, spans):
            block_ids = sequence.blocks.block_ids
            ids[row : row + end - start] = sequence.token_ids[start:end]
            positions[row : row + end - start] = np.arange(start, end)
            tables[row : row + end - start, : len(block_ids)] = block_ids
            row += end - start
        slots = tables[np.arange(rows), positions // block_size] * block_size + positions % block_size
        inputs = StepInputs(*(torch.from_numpy(array) for array in (ids[:, None], positions[:, None], slots, tables)))
        keep = ends = None  # logits rows to return, when prefill rows are among them
        if prefills or joined:  # each sequence's last row
            last_rows = np.cumsum([*([1] * decoding), *(end - start for start, end in spans)]) - 1
        if joined:
            head = np.full(self.graphs.joined.head_rows, last_rows[-1], dtype=np.int64)
            head[: len(last_rows)] = last_rows
            ends = self._static_ends.get((rows, width))
            if ends is None:
                ends = self._static_ends[(rows, width)] = torch.empty_like(torch.from_numpy(head), device=self.device)
            ends.copy_(_pinned(torch.from_numpy(head), self.device), non_blocking=True)
        elif prefills:
            keep = to_device(torch.from_numpy(last_rows), self.device)
        inputs = self._static_copy(inputs) if self.static_shapes else self._on_device(inputs)
        self._feed_device_tokens(inputs.input_ids, sequences, fed)
        return inputs, keep, ends

    def _feed_device_tokens(self, input_ids: torch.Tensor, sequences: list[Sequence], fed: torch.Tensor | None) -> None:
        """Write the pending sequences' tokens from `fed` (on the device) into their rows of `input_ids`."""
        rows = [row for row, sequence in enumerate(sequences) if sequence.pending]
        if not rows:
            return
        sources = [sequences[row].device_row for row in rows]
        if rows == sources and rows[-1] == len(rows) - 1:
            # The usual step: the same rows as the in-flight one, in its order (no index tensors to copy over).
            input_ids[: len(rows), 0] = fed[: len(rows)]
            return
        input_ids[to_device(rows, self.device, torch.long), 0] = fed[to_device(sources, self.device, torch.long)]

    def capture_decode_graphs(self, max_rows: int, greedy_steps: int = 1, greedy_rows: int = 0,
                              step_rows: int = 0) -> int:
        """With `cuda_graphs`, the decode steps' graphs captured before the first request (`DecodeGraphs.capture`);
        how many."""
        return self.graphs.capture(max_rows, greedy_steps, greedy_rows, step_rows)

    def takes_in_graph(self, rows: int, width: int) -> bool:
        """Whether a decode step of `rows` rows and tables of up to `width` blocks has a graph bucket
        (`DecodeGraphs.takes`)."""
        return self.graphs.takes(rows, width)

    def _padding_inputs(self, rows: int, width: int) -> StepInputs:
        """A decode step of padding rows only, on the host: token 0 at position 0, written to the trash block."""
        return StepInputs(
            torch.zeros((rows, 1), dtype=torch.long),
            torch.zeros((rows, 1), dtype=torch.long),
            torch.full((rows,), TRASH_BLOCK * self.pool.block_size, dtype=torch.long),
            torch.full((rows, width), TRASH_BLOCK, dtype=torch.long),
        )

    def warm_up_prefill(self, max_tokens: int, max_rows: int) -> bool:
        """With fused forwards, compile the prompt forwards now (each compile a few seconds on a GPU) rather than in
        the first requests' prefills, and run each size a prompt forward's tokens (up to `max_tokens`) and rows (up
        to `max_rows`) are padded to (`fused_forward.padded_counts`): the matmuls then meet no new shape mid-run,
        and the caching allocators hold the largest forward's memory. Whether there was anything to compile.
        Padding rows only: they write to the trash block."""
        if self.fused_forward is None or not self.fused_forward.compiled:
            return False
        block_size = self.pool.block_size
        # One row with two lengths (so its token count is compiled dynamic, not a constant), then several rows.
        shapes = [(1, 2), (1, 3), (2, 2)]
        shapes += [(1, tokens) for tokens in fused_forward.padded_counts(max_tokens) if tokens > 3]
        shapes += [(rows, 2) for rows in fused_forward.padded_counts(max_rows) if rows > 2]
        for rows, queries in shapes:
            self._forward(self._on_device(StepInputs(
                torch.zeros((rows, queries), dtype=torch.long),
                torch.zeros((rows, queries), dtype=torch.long),
                torch.full((rows * queries,), TRASH_BLOCK * block_size, dtype=torch.long),
                torch.full((rows, 1), TRASH_BLOCK, dtype=torch.long),
            )))
        return True

    def profile_step_peaks(self, max_tokens: int, max_rows: int, decode_rows: int, block_size: int) -> tuple[int, int]:
        """On CUDA, before the KV pool is sized (vLLM's profile run): the bytes the largest prompt forward (up to
        `max_tokens` tokens and `max_rows` rows, as the warm-up runs them) and the largest eager decode step
        (`decode_rows` rows) allocate beyond what is allocated now, run over a pool of a few blocks (padding rows only:
        they write to the trash block). Leaves that small pool allocated; `allocate_kv_pool` replaces it."""
        device = self.device
        self.allocate_kv_pool(8, block_size)
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        if not self.warm_up_prefill(max_tokens, max_rows):
            width = -(-max_tokens // self.pool.block_size)
            self._forward(self._on_device(StepInputs(
                torch.zeros((1, max_tokens), dtype=torch.long), torch.zeros((1, max_tokens), dtype=torch.long),
                torch.full((max_tokens,), TRASH_BLOCK * self.pool.block_size, dtype=torch.long),
                torch.full((1, width), TRASH_BLOCK, dtype=torch.long))))
        torch.cuda.synchronize(device)
        prefill = torch.cuda.max_memory_allocated(device) - base
        torch.cuda.reset_peak_memory_stats(device)
        self._forward(self._on_device(self._padding_inputs(decode_rows, 1)))
        torch.cuda.synchronize(device)
        decode = torch.cuda.max_memory_allocated(device) - base
        torch.cuda.empty_cache()
        return prefill, decode

    @property
    def max_blocks_per_sequence(self) -> int:
        return -(-self.max_positions // self.pool.block_size)

    def prefill_logits(self, sequence: Sequence) -> torch.Tensor:
        """One sequence's chunk `[num_computed, prefill_end)` prefilled as `prefill` does; `[chunk tokens, vocab]` float
        logits at every token of it (NVIDIA's context logits, a chunk at a time), paid only by requests that ask."""
        inputs = self._on_device(self._prefill_inputs([sequence]))
        return self._forward(inputs, ends=torch.arange(sequence.prefill_len, device=self.device), every_token=True)

    def _forward(self, *parts: StepInputs, ends: torch.Tensor | None = None, every_token: bool = False) -> torch.Tensor:
        """`[rows, vocab]` float logits at each row's last query, part after part (with `ends`, at those token rows
        instead; `every_token`: one part of one row, `ends` all its tokens): `fused_forward`'s when the runner has one,
        else transformers' forward over the pool (one part)."""
        if self.fused_forward is not None:
            return self.fused_forward(list(parts), self.pool, ends)
        (inputs,) = parts
        output = self.model(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask(self.pool.block_size),
            position_ids=inputs.positions,
            use_cache=True,
            # The lm_head over every prompt position would cost more than the rest of prefill: only where asked.
            logits_to_keep=0 if every_token else 1,
            **{self._cache_kwarg: PagedCache(self.pool, inputs)},
        )
        if every_token:
            return output.logits[0].float()
        logits = output.logits[:, -1, :].float()
        return logits if ends is None else logits[ends]

    def _on_device(self, inputs: StepInputs) -> StepInputs:
        if self.device.type == "cpu":
            return inputs
        return StepInputs(*(to_device(tensor, self.device) for tensor in inputs.tensors()))

    def _static_copy(self, inputs: StepInputs) -> StepInputs:
        """The bucket's own tensors, filled in place (same addresses every step of that bucket)."""
        key = tuple(inputs.block_tables.shape)
        static = self._static_inputs.get(key)
        if static is None:
            static = StepInputs(*(torch.empty_like(tensor, device=self.device) for tensor in inputs.tensors()))
            self._static_inputs[key] = static
        for target, source in zip(static.tensors(), inputs.tensors()):
            target.copy_(_pinned(source, self.device), non_blocking=True)
        return static


def _pinned(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The host tensor in pinned memory for a copy to a CUDA `device` (a copy from pageable memory waits)."""
    return tensor.pin_memory() if device.type == "cuda" else tensor
