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
took 102 s to compile). Compilation runs on a small pool, cheapest guide first, with bounded room (GuideCompiler);
a request waits at most `timeout_s` in its queue and `timeout_s` once its compilation started, on no thread of its
own (GuidedStarts). A guide whose compilation took longer, or whose grammar is over a quarter of the cache's bytes,
is kept as refused, so sending it again is refused at once (not served from the cache).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..executor_interface import FinishReason, Step

log = logging.getLogger(__name__)

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
# Kept outcomes at most (a refusal is a short message; compiled grammars are bounded by bytes, max_guide_cache_bytes).
MAX_CACHED_GRAMMARS = 256
DEFAULT_MAX_GUIDE_BYTES = 64 * 1024  # config.pbtxt `max_guide_bytes`
DEFAULT_GUIDE_COMPILE_TIMEOUT_S = 10.0  # config.pbtxt `guide_compile_timeout_s`
# config.pbtxt `max_guide_cache_bytes`: the compiled grammars kept, by their own size (CompiledGrammar's
# memory_size_bytes); one grammar may take at most a quarter of it (a 896-byte regex compiled to about 60 MiB).
DEFAULT_MAX_GUIDE_CACHE_BYTES = 64 * 1024 * 1024
# A count ({m,n}, maxLength, maxItems, ...) above this is refused; xgrammar unrolls counted repetitions.
MAX_GUIDE_COUNT = 10_000
# Counts of nested quantifiers multiply: ([a-z]{1,10}){1,10} compiled in 1.6 s here, {1,20} nested in 17 s.
MAX_GUIDE_NESTED_COUNT = 256
# Compilations at once, cheapest first; one that runs over its time keeps its thread until xgrammar returns (it cannot
# be interrupted). Beside them one thread takes only guides whose estimated cost (guide_cost) is at most
# CHEAP_GUIDE_COST, so a small guide never waits behind slow ones.
# Two, or one where the host has two cores or fewer (a compilation takes a core, which the engine needs).
COMPILE_THREADS = max(1, min(2, len(os.sched_getaffinity(0)) - 1))
CHEAP_GUIDE_COST = 1024
# Guides waiting for a compile thread, and requests waiting for any guide (queued or compiling), each counted apart
# for cheap guides and the others: past either the request is refused at once, UNAVAILABLE ("queue full"), so guided
# requests never fill the bound on requests, and slow guides never take the room of small ones.
MAX_QUEUED_COMPILES = 8
MAX_GUIDE_WAITERS = 16
_COUNT_KEYWORDS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties")
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_COUNT_KEYWORD_VALUE = re.compile(r'"(?:' + "|".join(_COUNT_KEYWORDS) + r')"\s*:\s*(\d+)')


class GuideError(ValueError):
    """The guide is refused: over a limit, or it does not compile (the message is then the compiler's)."""


class GuideBusy(GuideError):
    """The guide compiler has no room now (its queue or its waiters are full, or the guide waited its time in the
    queue): the client may retry. The message begins with "queue full" (UNAVAILABLE, the OpenAI frontend's 429)."""


@dataclass(eq=False)
class _Job:
    """One guide's compilation: queued until a thread takes it (`started`), with the requests waiting on it."""

    key: tuple[str, str]
    cost: int
    arrival: int
    cheap: bool
    waiters: list[_Waiter] = field(default_factory=list)
    started: float | None = None


@dataclass(eq=False)
class _Waiter:
    job: _Job
    callback: Callable[[Any], None]
    done: bool = False


class GuideCompiler:
    """Compiles guides against one tokenizer's vocabulary (logits width `vocab_size`); thread-safe.

    Each guide is compiled once, cheapest first, and its outcome kept (by type and guide): the compiled grammar (the
    kept ones together at most `max_cache_bytes`, least recently used dropped first), or the refusal when it does
    not compile, compiles to more than a quarter of `max_cache_bytes`, or took over `timeout_s` (then sending it
    again is refused at once, not compiled again nor served). A request waits at most `timeout_s` in the queue
    (then: busy, retry) and at most `timeout_s` once its guide's compilation is under way (then: too slow); a queued
    guide whose requests all left (timed out, cancelled) is never compiled. One that started runs to its end (xgrammar
    cannot be interrupted) on its thread, its outcome kept."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int] | None = None,
                 timeout_s: float = DEFAULT_GUIDE_COMPILE_TIMEOUT_S,
                 max_cache_bytes: int = DEFAULT_MAX_GUIDE_CACHE_BYTES) -> None:
        import xgrammar

        self._xgr = xgrammar
        self.timeout_s = timeout_s
        self.max_cache_bytes = max_cache_bytes
        self.max_grammar_bytes = max_cache_bytes // 4
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()  # (grammar or GuideError, bytes)
        self.cache_bytes = 0
        self._compiling: dict[tuple[str, str], _Job] = {}  # queued or compiling, one per guide
        self._queue: list[tuple[int, int, _Job]] = []  # heap: (cost, arrival, job)
        self._arrivals = itertools.count()
        self._queued = {True: 0, False: 0}  # queued jobs, cheap and not
        self._waiting = {True: 0, False: 0}  # requests waiting on a job, cheap and not
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._deadlines = _Deadlines()
        self._closing = False
        # Not daemons: the interpreter must not end under a compilation (xgrammar's threads abort the process); at
        # exit they finish the compilation under way and return (as a ThreadPoolExecutor's threads would).
        threading._register_atexit(self.close)  # noqa: SLF001 - the hook concurrent.futures uses for the same
        for number in range(COMPILE_THREADS + 1):
            cheap_only = number == COMPILE_THREADS
            threading.Thread(target=self._compile_jobs, args=(cheap_only,),
                             name="guide-compile-cheap" if cheap_only else f"guide-compile-{number}").start()

    def close(self) -> None:
        """The compile threads return once their compilation under way ends; queued guides are not compiled."""
        with self._work:
            self._closing = True
            self._work.notify_all()

    def when_compiled(self, guide_type: str, guide: str | None, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Call `callback` once with the CompiledGrammar or a GuideError (GuideBusy: retry later), without waiting:
        at once when the outcome is kept or there is no room, else from a compile thread or the deadline thread.
        Returns `leave`: the caller no longer waits (its request was cancelled); no callback follows it."""
        key = (guide_type, guide or "")
        with self._lock:
            kept = self._cache.get(key)
            if kept is not None:
                self._cache.move_to_end(key)
                outcome = kept[0] if not isinstance(kept[0], GuideError) else GuideError(str(kept[0]))
            else:
                try:
                    waiter = self._join(key, guide_type, guide, callback)
                except GuideBusy as exc:
                    outcome = exc
                else:
                    outcome = None
        if outcome is not None:
            callback(outcome)
            return lambda: None
        job = waiter.job
        if job.started is None:
            self._deadlines.add(self.timeout_s, lambda: self._queue_deadline(waiter))
        else:  # joins a compilation under way: waits `timeout_s` from now, as a request whose guide starts now
            self._deadlines.add(self.timeout_s, lambda: self._answer(waiter, self._too_slow()))
        return lambda: self._leave(waiter)

    def compile_within(self, guide_type: str, guide: str | None) -> Any:
        """The CompiledGrammar of this guide, waiting as `when_compiled` does; GuideError if it is refused."""
        done = threading.Event()
        outcome: list[Any] = []
        self.when_compiled(guide_type, guide, lambda result: (outcome.append(result), done.set()))
        done.wait()
        if isinstance(outcome[0], GuideError):
            raise outcome[0]
        return outcome[0]

    def compile(self, guide_type: str, guide: str | None) -> Any:
        """The CompiledGrammar of this guide, waiting as long as it takes (kept: at once); GuideError if it fails."""
        key = (guide_type, guide or "")
        with self._lock:
            kept = self._cache.get(key)
        outcome = kept[0] if kept is not None else self._compile_and_keep(key)
        if isinstance(outcome, GuideError):
            raise GuideError(str(outcome))
        return outcome

    def _join(self, key: tuple[str, str], guide_type: str, guide: str | None,
              callback: Callable[[Any], None]) -> _Waiter:
        """A waiter on this guide's job, queued if new (caller holds `_lock`); GuideBusy when there is no room."""
        job = self._compiling.get(key)
        cost = job.cost if job is not None else guide_cost(guide_type, guide)
        cheap = cost <= CHEAP_GUIDE_COST
        kind = "small guides" if cheap else "guides"
        if self._waiting[cheap] >= MAX_GUIDE_WAITERS:
            raise _busy(f"{self._waiting[cheap]} requests wait for their {kind} to compile (at most {MAX_GUIDE_WAITERS})")
        if job is None:
            if self._queued[cheap] >= MAX_QUEUED_COMPILES:
                raise _busy(f"{self._queued[cheap]} {kind} wait to be compiled (at most {MAX_QUEUED_COMPILES})")
            job = self._compiling[key] = _Job(key, cost, next(self._arrivals), cheap)
            heapq.heappush(self._queue, (job.cost, job.arrival, job))
            self._queued[cheap] += 1
            self._work.notify_all()
        waiter = _Waiter(job, callback)
        job.waiters.append(waiter)
        self._waiting[cheap] += 1
        return waiter

    # -- waiters ---------------------------------------------------------------------------------------------------
    def _queue_deadline(self, waiter: _Waiter) -> None:
        """`timeout_s` after it joined: a waiter whose guide is still queued is refused busy (retry), and leaves."""
        with self._lock:
            if waiter.done or waiter.job.started is not None:
                return
            ahead = len(self._queue) - 1
        self._answer(waiter, _busy(f"the guide waited guide_compile_timeout_s={self.timeout_s:g} s for a compile "
                                   f"thread ({ahead} other guides queued, {COMPILE_THREADS} threads busy)"))

    def _answer(self, waiter: _Waiter, outcome: Any) -> None:
        """Answer one waiter (once) and take it off its job; a job left without waiters before it started is
        dropped."""
        if self._remove(waiter):
            waiter.callback(outcome)

    def _leave(self, waiter: _Waiter) -> None:
        self._remove(waiter)

    def _remove(self, waiter: _Waiter) -> bool:
        with self._lock:
            if waiter.done:
                return False
            waiter.done = True
            job = waiter.job
            self._waiting[job.cheap] -= 1
            job.waiters.remove(waiter)
            if not job.waiters and job.started is None:  # abandoned before it started: never compiled
                self._compiling.pop(job.key, None)
                self._queue.remove((job.cost, job.arrival, job))
                heapq.heapify(self._queue)
                self._queued[job.cheap] -= 1
            return True

    # -- compile threads -------------------------------------------------------------------------------------------
    def _compile_jobs(self, cheap_only: bool) -> None:
        if not cheap_only:  # slow compilations yield the CPU to the engine and to small guides (Linux: a thread's nice)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + 10)
        while True:
            with self._work:
                job = self._take(cheap_only)
                while job is None:
                    if self._closing:
                        return
                    self._work.wait()
                    job = self._take(cheap_only)
                job.started = time.monotonic()
                waiters = list(job.waiters)
            for waiter in waiters:  # the time of the compilation itself, not of the queue before
                self._deadlines.add(self.timeout_s, lambda waiter=waiter: self._answer(waiter, self._too_slow()))
            outcome = self._compile_and_keep(job.key)
            with self._lock:
                self._compiling.pop(job.key, None)
                waiters = list(job.waiters)
            for waiter in waiters:
                self._answer(waiter, outcome if not isinstance(outcome, GuideError) else GuideError(str(outcome)))

    def _take(self, cheap_only: bool) -> _Job | None:
        """The cheapest queued job (for the cheap thread: only one at most CHEAP_GUIDE_COST); caller holds `_lock`."""
        if not self._queue or (cheap_only and not self._queue[0][2].cheap):
            return None
        job = heapq.heappop(self._queue)[2]
        self._queued[job.cheap] -= 1
        return job

    def _compile_and_keep(self, key: tuple[str, str]) -> Any:
        """Compile the guide here and keep what comes of it: the grammar, or a refusal when it does not compile,
        took over `timeout_s` (a resend must not skip the bound) or is over the size one grammar may take."""
        started = time.monotonic()
        try:
            compiled = self._compile(*key)
        except GuideError as exc:
            compiled = exc
        except Exception as exc:  # noqa: BLE001 - xgrammar's own failure: this guide's refusal, the thread goes on
            log.exception("compiling a guide failed")
            compiled = GuideError(f"{type(exc).__name__}: {exc}")
        seconds = time.monotonic() - started
        if not isinstance(compiled, GuideError):
            size = compiled.memory_size_bytes
            if seconds > self.timeout_s:
                compiled = self._too_slow()
            elif size > self.max_grammar_bytes:
                compiled = GuideError(f"it compiles to {size / 2**20:.1f} MiB, over the "
                                      f"{self.max_grammar_bytes / 2**20:g} MiB one compiled guide may take (a quarter "
                                      "of max_guide_cache_bytes)")
        size = 0 if isinstance(compiled, GuideError) else compiled.memory_size_bytes
        with self._lock:
            previous = self._cache.pop(key, None)
            self.cache_bytes -= previous[1] if previous else 0
            self._cache[key] = (compiled, size)
            self.cache_bytes += size
            while self.cache_bytes > self.max_cache_bytes or len(self._cache) > MAX_CACHED_GRAMMARS:
                _, (_, dropped) = self._cache.popitem(last=False)
                self.cache_bytes -= dropped
        return compiled

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


def _busy(detail: str) -> GuideBusy:
    return GuideBusy(f"queue full: the guide compiler is busy: {detail}; retry later")


def guide_cost(guide_type: str, guide: str | None) -> int:
    """A guide's compile cost, estimated from its text (no parsing): its bytes plus 64 per unit of every count it asks
    for ({m,n}, maxLength, ...), which cost far more than text. Orders the compile queue, cheapest first: `[0-9]+` is
    6, a schema with a `maxLength` 300 string (1.4 s to compile) over 19,200."""
    if not guide:
        return 0
    counts = sum(int(high) if high else int(low) for low, high in _QUANTIFIER.findall(guide))
    counts += sum(int(value) for value in _COUNT_KEYWORD_VALUE.findall(guide))
    return len(guide) + 64 * counts


class GuidedStarts:
    """Guided sequences waiting for their guide, by request id. Each starts (`start`: the engine's submit) once its
    grammar is compiled, or ends with one error step (`send_steps`): INVALID_ARG when the guide is refused or too
    slow, UNAVAILABLE ("queue full") when the compiler is busy; cancelled first, it ends CANCELLED and its guide is
    not compiled for it. No thread waits for a guide: a waiting request costs an entry here."""

    def __init__(self, compiler: Callable[[], GuideCompiler], start: Callable[[Any], None],
                 send_steps: Callable[[list[Step]], None]) -> None:
        self._compiler = compiler
        self._start = start
        self._send_steps = send_steps
        self._waiting: dict[int, Callable[[], None] | None] = {}  # request id -> its `leave`
        self._lock = threading.Lock()  # orders a start against a cancel

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(self, sequence: Any, guide_type: str, guide: str | None) -> None:
        compiler = self._compiler()
        request_id = sequence.request_id
        with self._lock:
            self._waiting[request_id] = None
        leave = compiler.when_compiled(guide_type, guide,
                                       lambda outcome: self._compiled(sequence, guide_type, outcome))
        with self._lock:
            if request_id in self._waiting:
                self._waiting[request_id] = leave

    def cancel(self, request_id: int) -> bool:
        """True when the request waited for its guide (it ends CANCELLED now); False when the engine has it or it
        ended: then it was submitted before this returned."""
        with self._lock:
            if request_id not in self._waiting:
                return False
            leave = self._waiting.pop(request_id)
        if leave is not None:
            leave()
        self._send_steps([Step(request_id, is_final=True, finish_reason=FinishReason.CANCELLED)])
        return True

    def _compiled(self, sequence: Any, guide_type: str, outcome: Any) -> None:
        error: Step | None = None
        if isinstance(outcome, GuideBusy):
            error = Step(sequence.request_id, is_final=True, finish_reason=FinishReason.ERROR, error=str(outcome),
                         client_error=True)
        elif isinstance(outcome, GuideError):
            error = Step(sequence.request_id, is_final=True, finish_reason=FinishReason.ERROR,
                         error=refusal_message(guide_type, outcome), client_error=True)
        else:
            try:
                sequence.guide = self._compiler().matcher(outcome, sequence.end_id)
            except Exception as exc:  # noqa: BLE001 - this request's own failure
                error = Step(sequence.request_id, is_final=True, finish_reason=FinishReason.ERROR,
                             error=f"request failed: {type(exc).__name__}: {exc}")
        with self._lock:
            if sequence.request_id not in self._waiting:
                return  # cancelled meanwhile
            del self._waiting[sequence.request_id]
            if error is None:
                self._start(sequence)
                return
        self._send_steps([error])


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
