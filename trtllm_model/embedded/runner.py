"""Forward passes over the model: a padded prefill for newly admitted prompts, one decode step for the batch."""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .kv_cache import BatchKVCache


class ModelRunner:
    """Runs a transformers causal LM's own forward against a `BatchKVCache`; returns last-position logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        config = model.config
        self.vocab_size: int = config.vocab_size
        self.max_positions: int = getattr(config, "max_position_embeddings", 1 << 30)
        self.num_layers: int = config.num_hidden_layers
        self.num_kv_heads: int = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        # transformers 5.x renamed `past_key_values` to `cache`; accept either.
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def attention_backends(self) -> contextlib.AbstractContextManager:
        """On CUDA, keep SDPA off cuDNN: it plans anew for every key length, so each decode step (one column
        longer than the last) paid about 1.5 ms of CPU per layer for it (measured on an H200, bfloat16)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def new_cache(self, rows: int = 1, columns: int = 16, max_slots: int | None = None) -> BatchKVCache:
        return BatchKVCache(
            self.num_layers, self.num_kv_heads, self.head_dim, self.dtype, self.device,
            rows=rows, columns=columns, max_slots=max_slots,
        )

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,  # the lm_head over every prompt position would cost more than the rest of prefill
            **{self._cache_kwarg: cache},
        )
        return output.logits[:, -1, :].float()

    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, BatchKVCache]:
        """Run the prompts left-padded in one forward; returns `[n, vocab]` logits and their own cache."""
        lengths = [len(prompt) for prompt in prompts]
        span = max(lengths)
        cache = self.new_cache(rows=len(prompts), columns=span)
        cache.begin_prefill(lengths)
        ids = torch.zeros((len(prompts), span), dtype=torch.long)
        positions = torch.zeros((len(prompts), span), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, span - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            positions[row, span - len(prompt) :] = torch.arange(len(prompt))
        logits = self._forward(ids.to(self.device), cache.prefill_mask(lengths), positions.to(self.device), cache)
        cache.finish_prefill(lengths)
        return logits, cache

    def prompt_logits(self, prompt: list[int]) -> np.ndarray:
        """`[prompt tokens, vocab]` logits at every prompt position (NVIDIA's context_logits): a forward of its own,
        without a cache, paid only by requests that ask for them."""
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
        return self.model(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()

    def decode(self, cache: BatchKVCache, last_tokens: list[int]) -> torch.Tensor:
        """One token per row (its previous output); returns `[rows, vocab]` logits."""
        cache.reserve(1)
        ids = torch.tensor(last_tokens, dtype=torch.long, device=self.device)[:, None]
        positions = torch.tensor(cache.lengths, dtype=torch.long, device=self.device)[:, None]
        logits = self._forward(ids, cache.decode_mask(), positions, cache)
        cache.advance(1)
        return logits
