"""A prompt's token ids from a transformers tokenizer, without the detour its `encode` takes for one text.

transformers' `encode` of one text wraps it in a batch of one for the Rust tokenizer's `encode_batch`, which hands it
to the tokenizers thread pool (rayon) and waits for it. For one text the Rust tokenizer's own `encode` gives the same
ids in the calling thread. `execute()` tokenizes its batch's text requests one after another while Triton holds the
next batch (docs/performance.md, "Streaming through Triton on an H100: `execute()` is the bottleneck"), so this is
what it calls.
"""

from __future__ import annotations

from .executor_interface import Tokenizer


def encode_text(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=...)`, through the Rust tokenizer when it gives the same ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not _plain(tokenizer, backend):
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return backend.encode(text, add_special_tokens=add_special_tokens).ids


def _plain(tokenizer: Tokenizer, backend) -> bool:
    """No truncation or padding set on the Rust tokenizer, and special tokens split (or not) as transformers would:
    transformers' `encode` sets both for its call; the Rust `encode` takes them as they are."""
    splits = bool(getattr(tokenizer, "split_special_tokens", False))
    return backend.truncation is None and backend.padding is None and backend.encode_special_tokens == splits
