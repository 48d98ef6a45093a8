"""Guided decoding (structured output) for the embedded engine, through xgrammar.

A guide (NVIDIA's `guided_decoding_guide_type` + `guided_decoding_guide`) is compiled once against the model's
vocabulary and kept (by type and guide); each guided sequence gets its own `GrammarMatcher`. At every step the
matchers of the batch's guided rows fill one token bitmask together and it is applied to the whole batch's logits
at once; the matcher then advances with the token the sequence accepts, and the sequence ends when its grammar
has terminated (it has accepted the end token, or nothing else may follow).

xgrammar is imported only when the first guide is compiled, so an engine that never sees one never loads it.

Guides come from untrusted clients. `check_guide` refuses, before any compilation, a guide over `max_guide_bytes`
and the counts that make xgrammar slow (measured in docs/security.md): a count above MAX_GUIDE_COUNT, or nested
quantifiers whose counts multiply past MAX_GUIDE_NESTED_COUNT (a JSON-schema `pattern` of `([a-z]{1,30}){1,30}`
took 102 s to compile). Compilation runs on a small pool and a caller waits at most `timeout_s` for it; a guide
whose compilation took longer is kept as refused, so sending it again is refused at once (not served from the cache).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

log = logging.getLogger(__name__)

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
# Compiled grammars kept, least recently used dropped first (a JSON schema's grammar is tens of kB).
MAX_CACHED_GRAMMARS = 256
DEFAULT_MAX_GUIDE_BYTES = 64 * 1024  # config.pbtxt `max_guide_bytes`
DEFAULT_GUIDE_COMPILE_TIMEOUT_S = 10.0  # config.pbtxt `guide_compile_timeout_s`
# A count ({m,n}, maxLength, maxItems, ...) above this is refused; xgrammar unrolls counted repetitions.
MAX_GUIDE_COUNT = 10_000
# Counts of nested quantifiers multiply: ([a-z]{1,10}){1,10} compiled in 1.6 s here, {1,20} nested in 17 s.
MAX_GUIDE_NESTED_COUNT = 256
# Compilations at once; one that times out keeps its thread until xgrammar returns (it cannot be interrupted).
COMPILE_THREADS = 2
_COUNT_KEYWORDS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties")
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class GuideError(ValueError):
    """The guide is refused: over a limit, or it does not compile (the message is then the compiler's)."""


class GuideCompiler:
    """Compiles guides against one tokenizer's vocabulary (logits width `vocab_size`); thread-safe.

    Each guide is compiled once, on a small pool, and its outcome kept (by type and guide): the compiled grammar,
    or the refusal when it does not compile or its compilation took over `timeout_s` (then sending it again is
    refused at once, not compiled again nor served)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int] | None = None,
                 timeout_s: float = DEFAULT_GUIDE_COMPILE_TIMEOUT_S) -> None:
        import xgrammar

        self._xgr = xgrammar
        self.timeout_s = timeout_s
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()  # CompiledGrammar or GuideError
        self._compiling: dict[tuple[str, str], Future] = {}  # one compilation per guide, however many ask for it
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="guide-compile")
        self._lock = threading.Lock()
        self._deadlines = _Deadlines()

    def compile_within(self, guide_type: str, guide: str | None) -> Any:
        """The CompiledGrammar of this guide; GuideError if it does not compile or takes over `timeout_s` (the
        caller stops waiting then; the compilation ends on its own, and its outcome is kept)."""
        try:
            return self._start(guide_type, guide).result(self.timeout_s)
        except FutureTimeout:
            raise self._too_slow() from None

    def when_compiled(self, guide_type: str, guide: str | None, callback: Callable[[Any], None]) -> None:
        """Call `callback` once with the CompiledGrammar or a GuideError, as `compile_within` would return or raise,
        without waiting: at once when the outcome is kept, else from the pool's or the deadline thread."""
        future = self._start(guide_type, guide)
        once = _Once(callback)
        if not future.done():
            self._deadlines.add(self.timeout_s, lambda: once(self._too_slow()))
        future.add_done_callback(lambda done: once(_outcome(done)))

    def compile(self, guide_type: str, guide: str | None) -> Any:
        """The CompiledGrammar of this guide, waiting as long as it takes (kept: at once); GuideError if it fails."""
        return self._start(guide_type, guide).result()

    def _start(self, guide_type: str, guide: str | None) -> Future:
        key = (guide_type, guide or "")
        with self._lock:
            kept = self._cache.get(key)
            if kept is not None:
                self._cache.move_to_end(key)
                future: Future = Future()
                if isinstance(kept, GuideError):
                    future.set_exception(GuideError(str(kept)))
                else:
                    future.set_result(kept)
                return future
            future = self._compiling.get(key)
            if future is None:
                future = self._compiling[key] = self._pool.submit(self._compile_and_keep, key)
            return future

    def _compile_and_keep(self, key: tuple[str, str]) -> Any:
        started = time.monotonic()
        try:
            outcome = self._compile(*key)
            if time.monotonic() - started > self.timeout_s:
                outcome = self._too_slow()  # never kept as good: a resend must not skip the bound
        except GuideError as exc:
            outcome = exc
        with self._lock:
            self._cache[key] = outcome
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
            self._compiling.pop(key, None)
        if isinstance(outcome, GuideError):
            raise GuideError(str(outcome))
        return outcome

    def _too_slow(self) -> GuideError:
        return GuideError(f"compiling it took over guide_compile_timeout_s={self.timeout_s:g} s; simplify the guide "
                          "(fewer or smaller counted repetitions, a smaller schema)")

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


def refusal_message(guide_type: str, error: GuideError) -> str:
    """What a request whose guide did not compile (or not in time) is told, naming the input."""
    return f"guided_decoding_guide: the {guide_type} guide does not compile: {error}"


class _Once:
    """A callback that runs only on its first call."""

    def __init__(self, callback: Callable[[Any], None]) -> None:
        self._callback = callback
        self._lock = threading.Lock()
        self._called = False

    def __call__(self, value: Any) -> None:
        with self._lock:
            if self._called:
                return
            self._called = True
        self._callback(value)


def _outcome(future: Future) -> Any:
    error = future.exception()
    return error if error is not None else future.result()


class _Deadlines:
    """One thread that runs each added function once its delay has passed (started with the first)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, delay_s: float, action: Callable[[], None]) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + delay_s, next(self._order), action))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="guide-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, action = heapq.heappop(self._due)
            try:
                action()
            except Exception:
                log.exception("a guide deadline's action failed")


def check_guide(guide_type: str, guide: str | None, max_bytes: int) -> None:
    """GuideError naming the limit when the guide is over `max_bytes` or asks for counts that compile slowly;
    cheap (no compilation), so it runs before anything is compiled."""
    if not guide:
        return
    size = len(guide.encode())
    if size > max_bytes:
        raise GuideError(f"{size} bytes is over max_guide_bytes={max_bytes}")
    if guide_type == "regex":
        _check_counts(guide, "the regex")
    elif guide_type == "ebnf_grammar":
        _check_counts(re.sub(r'"(?:[^"\\]|\\.)*"', '""', guide), "the grammar")  # braces in literals count nothing
    elif guide_type in ("json_schema", "structural_tag"):
        try:
            schema = json.loads(guide)
        except ValueError:
            return  # not JSON: the compiler says why
        except RecursionError:
            raise GuideError("the schema is nested too deeply") from None
        try:
            _check_schema_counts(schema)
        except RecursionError:
            raise GuideError("the schema is nested too deeply") from None


def _check_schema_counts(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _check_schema_counts(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in _COUNT_KEYWORDS and isinstance(value, int) and value > MAX_GUIDE_COUNT:
                raise GuideError(f"{key} {value} is over the {MAX_GUIDE_COUNT} a guide may ask for")
            if key == "pattern" and isinstance(value, str):
                _check_counts(value, "pattern")
            else:
                _check_schema_counts(value)


def _check_counts(pattern: str, where: str) -> None:
    """Every {m,n} count of a regex (or EBNF) at most MAX_GUIDE_COUNT, and the counts of nested groups multiplied
    at most MAX_GUIDE_NESTED_COUNT. A scan, not a parser: escapes and character classes are skipped."""
    enclosing = [1]  # per open group: the largest product of counts inside it so far
    atom = 1  # the product the quantifier that may follow applies to (a closed group's inside, else 1)
    i = 0
    while i < len(pattern):
        char = pattern[i]
        count = _QUANTIFIER.match(pattern, i)
        if count:
            low, high = int(count.group(1)), count.group(2)
            value = int(high) if high else low
            if value > MAX_GUIDE_COUNT:
                raise GuideError(f"{where}: the count {count.group(0)} is over the {MAX_GUIDE_COUNT} a guide may ask for")
            product = value * atom
            if atom > 1 and product > MAX_GUIDE_NESTED_COUNT:
                raise GuideError(f"{where}: nested counts multiply to {product}, over the {MAX_GUIDE_NESTED_COUNT} a "
                                 "guide may ask for")
            enclosing[-1] = max(enclosing[-1], product)
            atom, i = 1, count.end()
            continue
        if char == "\\":
            i += 2
        elif char == "[":
            end = i + 1 + (pattern[i + 1: i + 2] in ("]", "^"))
            while end < len(pattern) and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            i = end + 1
        elif char == "(":
            enclosing.append(1)
            i += 1
        elif char == ")" and len(enclosing) > 1:
            atom = enclosing.pop()
            enclosing[-1] = max(enclosing[-1], atom)
            i += 1
            continue
        else:
            i += 1
        atom = 1


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
