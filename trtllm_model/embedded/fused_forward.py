"""The forwards of a Llama-family model (SmolLM2) in few kernels: decode steps (one query a row, inside the CUDA
graphs) and prompt chunks (several queries a row) alike.

transformers' forward launches about 33 kernels a layer for a decode step (976 a SmolLM2 step at 1 stream on an
H200, `bench/step_profile.py`): separate q, k and v projections, six for each rotary embedding, a mask conversion in
every attention, unfused residual adds. At small batches a step costs what its kernels' launches and tails cost, not
what they compute; and a prompt's eager forward costs the host as many launches. Here a layer is:

- the paged attention, eager: write the tokens' keys and values to their slots, then for decode rows on CUDA one
  Triton kernel that reads each row's blocks in the pool (`paged_attention`), else gather each row's blocks and SDPA;
- everything from one attention's output to the next attention's query, key and value, as one `torch.compile`d
  function (inductor): output projection, residual add and RMSNorm fused, gate and up in one GEMM, SiLU and product
  fused, down projection, the next layer's add and norm fused, one qkv GEMM, the rotary embedding fused.

The compiled functions take the layer's weights as arguments, so one graph serves every layer (a few compiles in
all: the first shape, then shapes made dynamic, then one token). The merged qkv and gate/up weights are copies made
once. The step's attention mask is made once, not per layer. Within a CUDA graph capture nothing compiles: the
runner's warm-up runs each bucket's shape first. Measured on an H200: docs/performance.md ("fused prompt forwards"
and "fused decode steps").

Only plain Llama layers are taken (`supports`); anything else keeps transformers' forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from . import invariant_attention, row_invariance
from .kv_cache import KvBlockPool, StepInputs


@dataclass(frozen=True, slots=True)
class _LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [q; k; v] rows of the three projections
    output: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [gate; up]
    down: torch.Tensor


@dataclass(frozen=True, slots=True)
class _PartAttention:
    """How one part of a forward attends: its tokens `[start, start + count)` in `rows` rows."""

    start: int
    count: int
    rows: int
    slots: torch.Tensor  # where each token's key and value go
    tables: torch.Tensor  # [rows, width]
    mask: torch.Tensor | None  # additive; None and no `positions`: causal (one row from position 0)
    positions: torch.Tensor | None  # [rows], decode rows for the paged kernel (which needs no mask)
    query_positions: torch.Tensor  # [rows, queries]


def supports(model: torch.nn.Module) -> bool:
    """A LlamaForCausalLM with bias-free projections, SiLU MLPs and one weight per projection."""
    config = model.config
    return (
        getattr(config, "model_type", None) == "llama"
        and getattr(config, "hidden_act", None) == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
        and hasattr(model, "lm_head")
        and all(module.bias is None for module in model.model.layers.modules() if isinstance(module, torch.nn.Linear))
    )


class FusedForward:
    """`__call__(parts, pool)`: `[rows, vocab]` float32 logits at each row's last query, as the runner's forward
    gives; in each part a row has one query (decode) or a prompt's chunk, left-padded (prefill). `compile` False
    (the CPU's default: inductor's C++ would compile for minutes at load on a small host) runs the pieces eagerly.
    `invariant`: every token's numbers the same whatever shares its forward (`invariant_attention`; measured on the
    CPU): rows padded to a multiple of four through the matrix products, and attention in fixed key tiles."""

    def __init__(self, model: torch.nn.Module, compile: bool = True, invariant: bool = False) -> None:
        self.compiled = self.pads = compile
        self.invariant = invariant
        config = model.config
        body = model.model
        self.embed = body.embed_tokens
        self.rotary = body.rotary_emb
        self.final_norm = body.norm.weight
        self.lm_head = model.lm_head.weight
        self.eps = float(config.rms_norm_eps)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = body.layers[0].self_attn.scaling
        # Decode rows' attention as one kernel a layer (CUDA, where Triton runs it); else gathered blocks and SDPA
        # (or, invariant, `invariant_attention`).
        self.decode_attention: Callable | None = None if invariant else _paged_decode_attention(
            self.embed.weight.device, self.heads, self.kv_heads, self.head_dim)
        with torch.no_grad():
            self.layers = [
                _LayerWeights(
                    layer.input_layernorm.weight,
                    torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                               layer.self_attn.v_proj.weight]),
                    layer.self_attn.o_proj.weight,
                    layer.post_attention_layernorm.weight,
                    torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
                    layer.mlp.down_proj.weight,
                )
                for layer in body.layers
            ]
            # Invariant on the CPU: the products run in the dtype whose rows this host keeps invariant
            # (`row_invariance`); float32 copies of the weights where their own dtype's are not.
            if invariant and self.lm_head.device.type == "cpu":
                first = self.layers[0]
                products = row_invariance.product_dtype([first.qkv, first.output, first.gate_up, first.down,
                                                         self.lm_head])
                if products != self.lm_head.dtype:
                    self.lm_head = self.lm_head.to(products)
                    self.layers = [replace(layer, qkv=layer.qkv.to(products), output=layer.output.to(products),
                                           gate_up=layer.gate_up.to(products), down=layer.down.to(products))
                                   for layer in self.layers]
        wrap: Callable = (lambda function: torch.compile(function, fullgraph=True)) if compile else (lambda f: f)
        self._first = wrap(self._attention_inputs)
        self._between = wrap(self._between_attentions)
        self._last = wrap(self._last_logits)

    def __call__(self, parts: list[StepInputs], pool: KvBlockPool, ends: torch.Tensor | None = None) -> torch.Tensor:
        """`[rows, vocab]` float32 logits at each row's last query, part after part; with `ends`, `[len(ends), vocab]`
        at those tokens (a prompt's tokens as rows of a decode step: only its last one's). The parts' tokens go
        through the dense pieces together (each weight read once a forward) and attend part by part, so decode rows
        and a prompt's chunk can share a forward (`ModelRunner.mixes_prompts`)."""
        shapes = [tuple(part.input_ids.shape) for part in parts]
        tokens, rows = sum(r * q for r, q in shapes), sum(r for r, _ in shapes)
        # With compiled pieces (`pads`), a prompt chunk's tokens go through them padded to a bucket (`padded_count`),
        # and its last tokens through the head likewise: the matmuls then meet few shapes. A decode step's rows are
        # the graphs' buckets. Eager pieces (the CPU) take the tokens as they are: padding there is only work.
        prompt = any(queries > 1 for _, queries in shapes)
        padded, head_rows = (padded_count(tokens), padded_count(rows)) if prompt and self.pads else (tokens, rows)
        if self.invariant:
            padded = invariant_attention.padded_rows(tokens)
            head_rows = invariant_attention.padded_rows(rows if ends is None else ends.shape[0])
        ids = _joined([part.input_ids.reshape(-1) for part in parts])
        positions = _joined([part.positions.reshape(-1) for part in parts])[None]
        if padded > tokens:  # padding tokens: id 0 at position 0, never attended to nor written to the pool
            ids, positions = F.pad(ids, (0, padded - tokens)), F.pad(positions, (0, padded - tokens))
        # The compiled pieces work on tokens (`[padded, ...]`), the attention on each part's rows.
        hidden = self.embed(ids)
        cos, sin = (part.reshape(padded, -1) for part in self.rotary(hidden, positions))
        attending, last_tokens, offset = [], [], 0
        for part, (part_rows, queries) in zip(parts, shapes):
            mask = positions = None  # neither: a prompt's first chunk, one row, eager: causal (see `_attend`)
            if self.invariant:  # `invariant_attention` masks by the queries' positions
                pass
            elif queries == 1 and self.decode_attention is not None:
                positions = part.positions.reshape(-1)  # the paged kernel's bound for each row: no mask
            elif self.pads or queries == 1 or part_rows > 1 or int(part.positions[0, 0]) != 0:
                # Additive, in the model's dtype, made once: SDPA would convert a boolean mask in every layer. With
                # several queries a row's query heads go group by group (see `_attend`): each group repeats the mask.
                allowed = part.attention_mask(pool.block_size)
                mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device).masked_fill_(~allowed,
                                                                                                         -torch.inf)
                if queries > 1:
                    mask = mask.repeat(1, 1, self.heads // self.kv_heads, 1)
            attending.append(_PartAttention(offset, part_rows * queries, part_rows, part.slot_mapping,
                                            part.block_tables, mask, positions, part.positions))
            if ends is None:
                last_tokens.append(torch.arange(offset + queries - 1, offset + part_rows * queries, queries,
                                                device=hidden.device))
            offset += part_rows * queries
        if ends is not None:
            rows = ends.shape[0]
            if head_rows > rows:  # the last token again (read on the device: no wait, nothing in a graph)
                ends = torch.cat([ends, ends[-1:].expand(head_rows - rows)])
        else:
            ends = _joined(last_tokens)  # each row's last token; the head's padding rows read the last row's again
            if head_rows > rows:
                ends = F.pad(ends, (0, head_rows - rows), value=tokens - 1)

        def attend(index: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            attention = _joined([
                self._attend(pool, index, query[part.start : part.start + part.count],
                             key[part.start : part.start + part.count], value[part.start : part.start + part.count],
                             part)
                for part in attending])
            return F.pad(attention, (0, 0, 0, padded - tokens)) if padded > tokens else attention

        first, last = self.layers[0], len(self.layers) - 1
        query, key, value = self._first(hidden, first.input_norm, first.qkv, cos, sin)
        for index, (layer, after) in enumerate(zip(self.layers, self.layers[1:])):
            hidden, query, key, value = self._between(hidden, attend(index, query, key, value), layer.output,
                                                      layer.post_norm, layer.gate_up, layer.down, after.input_norm,
                                                      after.qkv, cos, sin)
        layer = self.layers[last]
        logits = self._last(hidden, attend(last, query, key, value), layer.output, layer.post_norm, layer.gate_up,
                            layer.down, self.final_norm, self.lm_head, ends)
        return logits[:rows]

    def _attend(self, pool: KvBlockPool, index: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                part: _PartAttention) -> torch.Tensor:
        """Write the tokens' keys and values, then attend: `[tokens, heads x head_dim]`. Decode rows on CUDA go
        through the paged kernel (`paged_attention`), which reads each row's blocks in the pool. Otherwise each
        row's blocks are gathered and SDPA attends, the query heads that share a key-value head going as that head's
        queries (as `model_patches.grouped_decode_attention`), so SDPA reads each key and value once. No mask: one
        row whose queries are positions 0.. (a prompt's first chunk), attended as causal, which the CPU's flash
        kernel does without the upper triangle: 40 ms a layer against 67 with a mask for 2,048 tokens in bfloat16
        here."""
        keys, values = pool.keys[index], pool.values[index]
        kv_heads, dim, group = self.kv_heads, self.head_dim, self.heads // self.kv_heads
        rows, mask = part.rows, part.mask
        keys.view(-1, kv_heads, dim).index_copy_(0, part.slots, key)
        values.view(-1, kv_heads, dim).index_copy_(0, part.slots, value)
        if self.invariant:
            return invariant_attention.attention(query, keys, values, part.tables, part.query_positions, self.scaling)
        if part.positions is not None:
            return self.decode_attention(query, keys, values, part.tables, part.positions, self.scaling)
        flat_tables = part.tables.reshape(-1)
        width = part.tables.shape[1] * keys.shape[1]
        gathered_keys = keys.index_select(0, flat_tables).view(rows, width, kv_heads, dim).transpose(1, 2)
        gathered_values = values.index_select(0, flat_tables).view(rows, width, kv_heads, dim).transpose(1, 2)
        queries = query.shape[0] // rows
        if mask is None:  # keys past the chunk (the last block's rest) come after every query: causal leaves them out
            output = F.scaled_dot_product_attention(query.view(1, queries, self.heads, dim).transpose(1, 2),
                                                    gathered_keys, gathered_values, is_causal=True, enable_gqa=True,
                                                    scale=self.scaling)
            return output.transpose(1, 2).reshape(queries, self.heads * dim)
        # [rows x queries, kv_heads x group, dim] -> [rows, kv_heads, group x queries, dim] (a view for one query)
        grouped = query.view(rows, queries, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(
            rows, kv_heads, group * queries, dim)
        output = F.scaled_dot_product_attention(grouped, gathered_keys, gathered_values, attn_mask=mask,
                                                scale=self.scaling)
        return output.view(rows, kv_heads, group, queries, dim).permute(0, 3, 1, 2, 4).reshape(
            rows * queries, self.heads * dim)

    # -- the compiled pieces: pure functions of tensors (weights included), so one graph serves every layer ---------
    def _attention_inputs(self, hidden: torch.Tensor, norm: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's rotated query `[tokens, heads, dim]`, key and value `[tokens, kv_heads, dim]`."""
        rows, dim = hidden.shape[0], self.head_dim
        projected = _linear(_rms_norm(hidden, norm, self.eps), qkv)
        query, key, value = projected.split([self.heads * dim, self.kv_heads * dim, self.kv_heads * dim], dim=-1)
        query = _rotated(query.view(rows, self.heads, dim), cos, sin)
        key = _rotated(key.view(rows, self.kv_heads, dim), cos, sin)
        return query, key, value.reshape(rows, self.kv_heads, dim)

    def _layer_output(self, hidden: torch.Tensor, attention: torch.Tensor, output: torch.Tensor,
                      post_norm: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """The residual stream after the layer's attention output and MLP."""
        hidden = hidden + _linear(attention, output)
        gate, up = _linear(_rms_norm(hidden, post_norm, self.eps), gate_up).chunk(2, dim=-1)
        return hidden + _linear(F.silu(gate) * up, down)

    def _between_attentions(self, hidden, attention, output, post_norm, gate_up, down, next_norm, next_qkv, cos, sin):
        hidden = self._layer_output(hidden, attention, output, post_norm, gate_up, down)
        return hidden, *self._attention_inputs(hidden, next_norm, next_qkv, cos, sin)

    def _last_logits(self, hidden, attention, output, post_norm, gate_up, down, final_norm, lm_head,
                     last) -> torch.Tensor:
        hidden = self._layer_output(hidden, attention, output, post_norm, gate_up, down)[last]
        return _linear(_rms_norm(hidden, final_norm, self.eps), lm_head).float()


def _linear(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`hidden @ weight.T` in the weight's dtype, the result in the hidden states' (`row_invariance`: float32
    weights under bfloat16 hidden states, for a host whose bfloat16 products are not row-invariant)."""
    if hidden.dtype == weight.dtype:
        return F.linear(hidden, weight)
    return F.linear(hidden.to(weight.dtype), weight).to(hidden.dtype)


def _paged_decode_attention(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> Callable | None:
    """`paged_attention.decode_attention` on CUDA for the heads it takes, if Triton imports; else None."""
    if device.type != "cuda":
        return None
    try:
        from . import paged_attention
    except ImportError:
        return None
    return paged_attention.decode_attention if paged_attention.supports(heads, kv_heads, head_dim) else None


def padded_count(count: int) -> int:
    """`count` up to the next of a few sizes: itself up to 16, then eight steps an octave (16, 18, ..., 30, 32, 36,
    ..., 60, 64, 72, ...), at most 12.5 % more. On an H200 the first matmul call at a token count the process had
    not seen cost the host 144-1,536 us, a seen one about 20 (bench/gpu/blas_host_cost.py); the runner's warm-up
    runs every size a prompt forward can take (`ModelRunner.warm_up_prefill`)."""
    if count <= 16:
        return count
    step = 1 << (count.bit_length() - 4)
    return -(-count // step) * step


def padded_counts(largest: int) -> list[int]:
    """Every size `padded_count` gives up to `padded_count(largest)`, in order."""
    sizes, count = [], 1
    while not sizes or sizes[-1] < padded_count(largest):
        sizes.append(padded_count(count))
        count = sizes[-1] + 1
    return sizes


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors concatenated; one is passed as it is (no copy: inside a CUDA graph, no kernel)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, roundings included: normalised in float32, rounded to the model's dtype, then
    scaled by the weight. `F.rms_norm` rounds once, after the weight: in bfloat16 on a CPU with AVX512-BF16 that
    flipped a near-tie of SmolLM2's first answer token against transformers' forward ("The" 25.50, "L" 25.375),
    and the served answer to "What is the capital of France?" was no longer Paris. Compiled (CUDA), it fuses all
    the same."""
    normalised = hidden.float()
    normalised = normalised * torch.rsqrt(normalised.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normalised.to(hidden.dtype)


def _rotated(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `[tokens, heads, dim]` with `[tokens, dim]` cos and sin (transformers' rotate-half form)."""
    half = states.shape[-1] // 2
    rotated = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return states * cos[:, None] + rotated * sin[:, None]
