"""A prompt's token ids from a transformers tokenizer, without the detour its `encode` takes for one text.

transformers' `encode` of one text wraps it in a batch of one for the Rust tokenizer's `encode_batch`, which hands it
to the tokenizers thread pool (rayon) and waits for it. For one text the Rust tokenizer's own `encode` gives the same
ids in the calling thread, so one text is encoded that way.

Several texts (an `execute()` batch's prompts) go to the Rust tokenizer's `encode_batch` in one call: it tokenizes
them on its own threads with the interpreter's lock let go, so the stub's other threads run meanwhile and the lock is
given back once for the batch. Tokenizing was a fifth of `execute()`'s interpreter time a request (docs/performance.md,
"One tokenizer call a batch").
"""

from __future__ import annotations

from ..executor_interface import Tokenizer


def encode_text(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=...)`, through the Rust tokenizer when it gives the same ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not _plain(tokenizer, backend):
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return backend.encode(text, add_special_tokens=add_special_tokens).ids


def encode_texts(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
    """`encode_text` of each text, in one call to the Rust tokenizer where it gives the same ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if len(texts) < 2 or backend is None or not _plain(tokenizer, backend):
        return [encode_text(tokenizer, text, add_special_tokens) for text in texts]
    return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]


def _plain(tokenizer: Tokenizer, backend) -> bool:
    """No truncation or padding set on the Rust tokenizer, and special tokens split (or not) as transformers would:
    transformers' `encode` sets both for its call; the Rust `encode` takes them as they are."""
    splits = bool(getattr(tokenizer, "split_special_tokens", False))
    return backend.truncation is None and backend.padding is None and backend.encode_special_tokens == splits
