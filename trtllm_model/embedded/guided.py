"""Guided decoding (structured output) for the embedded engine, through xgrammar.

A guide (NVIDIA's `guided_decoding_guide_type` + `guided_decoding_guide`) is compiled once against the model's
vocabulary and kept (by type and guide); each guided sequence gets its own `GrammarMatcher`. At every step the
matchers of the batch's guided rows fill one token bitmask together and it is applied to the whole batch's logits
at once; the matcher then advances with the token the sequence accepts, and the sequence ends when its grammar
has terminated (it has accepted the end token, or nothing else may follow).

xgrammar is imported only when the first guide is compiled, so an engine that never sees one never loads it.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import torch

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
# Compiled grammars kept, least recently used dropped first (a JSON schema's grammar is tens of kB).
MAX_CACHED_GRAMMARS = 256


class GuideError(ValueError):
    """The guide does not compile; the message is the compiler's."""


class GuideCompiler:
    """Compiles guides against one tokenizer's vocabulary (logits width `vocab_size`); thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int] | None = None) -> None:
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, guide_type: str, guide: str | None) -> Any:
        """The CompiledGrammar of this guide, from the cache when it was compiled before; GuideError if it fails."""
        key = (guide_type, guide or "")
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                return compiled
        compiled = self._compile(guide_type, guide or "")  # outside the lock: a big schema takes a while
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any, end_id: int | None) -> Any:
        """A fresh matcher for one sequence; it ends on the request's end id when it has one."""
        return self._xgr.GrammarMatcher(compiled, override_stop_tokens=[end_id] if end_id is not None else None)

    def _compile(self, guide_type: str, guide: str) -> Any:
        compiler = self._compiler
        try:
            if guide_type == "json":
                return compiler.compile_builtin_json_grammar()
            if guide_type == "json_schema":
                return compiler.compile_json_schema(guide)
            if guide_type == "regex":
                return compiler.compile_regex(guide)
            if guide_type == "ebnf_grammar":
                return compiler.compile_grammar(guide)
            if guide_type == "structural_tag":
                return self._compile_structural_tag(guide)
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:  # xgrammar's errors derive from these
            raise GuideError(_compiler_message(exc)) from None
        raise GuideError(f"unknown guide type {guide_type!r}: expected one of {', '.join(GUIDE_TYPES)}")

    def _compile_structural_tag(self, guide: str) -> Any:
        tag = json.loads(guide)
        if isinstance(tag, dict) and "structures" in tag and "triggers" in tag:
            # TensorRT-LLM's (and trtllm-serve's) form: begin / JSON schema / end per structure, plus triggers.
            items = [
                self._xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                for s in tag["structures"]
            ]
            return self._compiler.compile_structural_tag(items, tag["triggers"])
        return self._compiler.compile_structural_tag(guide)  # xgrammar's own form ({"type": "structural_tag", ...})


def _compiler_message(exc: Exception) -> str:
    """xgrammar's message without its log prefix ("[11:44:46] /project/cpp/regex_converter.cc:83: ")."""
    message = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(exc).strip())
    return message.removeprefix("Check failed: (error.empty()) is false: ") or type(exc).__name__


def mask_guided_logits(logits: torch.Tensor, matchers: list[Any | None]) -> None:
    """In place: every guided row of `[rows, vocab]` logits keeps only the tokens its grammar allows next.

    One bitmask for the batch, filled by all guided rows' matchers, applied in one call.
    """
    rows = [row for row, matcher in enumerate(matchers) if matcher is not None]
    if not rows:
        return
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(matchers), logits.shape[-1])
    for row in rows:
        matchers[row].fill_next_token_bitmask(bitmask, row)
    if logits.device.type != "cpu":
        bitmask = bitmask.to(logits.device, non_blocking=True)
    xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=rows)


def advance(matcher: Any, token: int) -> bool:
    """Feed the accepted token to the sequence's matcher; True when the grammar has terminated (nothing may follow)."""
    if not matcher.accept_token(token):
        raise RuntimeError(f"token {token} is outside the guide's grammar")
    return matcher.is_terminated()
