"""Generated token ids -> the text a client sees: incremental detokenization, cut before the first stop string.

Text that might be the start of a stop string is held back until the next tokens show it is not, so a stop
string never leaks out, not even in part. With stop strings each token is pushed on its own, so the count of tokens
ends at the token that completed the stop. Each stop string is matched a character at a time (Knuth-Morris-Pratt),
so a token costs time in proportion to its own text, however long the text so far or the stop strings are.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..executor_interface import Tokenizer
from ..pipeline.detokenizer import IncrementalDetokenizer


@dataclass(slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]] | None = None  # the likeliest tokens at its position, when asked for


class StopMatcher:
    """One stop string over a growing text: `matched` is the length of the longest end of the text so far that
    begins the stop string (all of it: the stop string just ended, and the matcher is done)."""

    __slots__ = ("stop", "_fallback", "matched")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.matched = 0
        # _fallback[i]: the longest proper prefix of stop[: i + 1] that is also its suffix (KMP's failure function).
        fallback = [0] * len(stop)
        length = 0
        for i in range(1, len(stop)):
            while length and stop[i] != stop[length]:
                length = fallback[length - 1]
            if stop[i] == stop[length]:
                length += 1
            fallback[i] = length
        self._fallback = fallback

    def feed(self, char: str) -> bool:
        """Whether the stop string ends with this next character of the text."""
        stop, matched = self.stop, self.matched
        while matched and stop[matched] != char:
            matched = self._fallback[matched - 1]
        if stop[matched] == char:
            matched += 1
        self.matched = matched
        return matched == len(stop)


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stops: list[str], with_logprobs: bool = False) -> None:
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = [StopMatcher(stop) for stop in stops]
        self._held = ""  # decoded, not yet released: it may begin a stop string
        self.with_logprobs = with_logprobs
        self.logprobs: list[TokenLogprob] = []  # one per counted token, when asked for
        self.tokens = 0  # generated tokens up to the end (or the stop)
        self.stopped = False  # a stop string ended the text
        self._text_so_far: list[str] = []  # a text model's pieces, for the final token count

    def push(self, token_ids: list[int], log_probs: list[float] | None = None,
             top: list[list[tuple[int, float]]] | None = None) -> str:
        """The text these tokens release (may be empty); `top`: each token's likeliest alternatives (token id, log
        prob)."""
        if self.stopped:
            return ""
        if not self._stops:
            self._count(token_ids, log_probs, top)
            return self._detokenizer.push(token_ids)
        released = []
        for index, token in enumerate(token_ids):
            self._count([token], log_probs[index : index + 1] if log_probs else None,
                        top[index : index + 1] if top else None)
            released.append(self._release(self._detokenizer.push([token])))
            if self.stopped:
                break
        return "".join(released)

    def push_text(self, text: str) -> str:
        """A text model's new text: what it releases (its tokens counted with the tokenizer, at finish exactly)."""
        if self.stopped or not text:
            return ""
        self._text_so_far.append(text)
        self.tokens += len(self._tokenizer.encode(text, add_special_tokens=False))
        return self._release(text) if self._stops else text

    def finish(self) -> str:
        """At the end of the generation: the text still held back."""
        if self._text_so_far:  # a text model: the count of the whole text, not the sum of its pieces'
            self.tokens = len(self._tokenizer.encode("".join(self._text_so_far), add_special_tokens=False))
            self._text_so_far.clear()
        if self.stopped:
            return ""
        if not self._stops:
            return self._detokenizer.flush()
        text = self._release(self._detokenizer.flush())
        if not self.stopped:
            text, self._held = text + self._held, ""
        return text

    def _count(self, token_ids: list[int], log_probs: list[float] | None,
               top: list[list[tuple[int, float]]] | None = None) -> None:
        self.tokens += len(token_ids)
        if self.with_logprobs:
            values = list(log_probs or [])
            decode = self._tokenizer.decode
            for index, token in enumerate(token_ids):
                text = decode([token], skip_special_tokens=False)
                alternatives = None
                if top is not None and index < len(top):
                    alternatives = [(decode([i], skip_special_tokens=False), v) for i, v in top[index]]
                self.logprobs.append(TokenLogprob(text, values[index] if index < len(values) else float("nan"),
                                                  alternatives))

    def _release(self, new: str) -> str:
        """The text that `new` (what follows the held text) lets go: up to a stop string that ends in it, or all but
        the end that may begin one (held back)."""
        text = self._held + new
        for end, char in enumerate(new, len(self._held) + 1):
            cut = min((end - len(m.stop) for m in self._stops if m.feed(char)), default=-1)
            if cut >= 0:  # the stop strings ending here: the longest begins first
                self.stopped, self._held = True, ""
                return text[:cut]
        keep = max(m.matched for m in self._stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]
