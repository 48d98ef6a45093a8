"""Generated token ids -> the text a client sees: incremental detokenization, cut before the first stop string.

Text that might be the start of a stop string is held back until the next tokens show it is not, so a stop
string never leaks out, not even in part. With stop strings
each token is pushed on its own, so the count of tokens ends at the token that completed the stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..detokenizer import IncrementalDetokenizer
from ..executor_interface import Tokenizer


@dataclass(slots=True)
class TokenLogprob:
    token: str
    logprob: float


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stops: list[str], with_logprobs: bool = False) -> None:
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = stops
        self._pending = ""  # decoded, not yet released
        self.with_logprobs = with_logprobs
        self.logprobs: list[TokenLogprob] = []  # one per counted token, when asked for
        self.tokens = 0  # generated tokens up to the end (or the stop)
        self.stopped = False  # a stop string ended the text

    def push(self, token_ids: list[int], log_probs: list[float] | None = None) -> str:
        """The text these tokens release (may be empty)."""
        if self.stopped:
            return ""
        if not self._stops:
            self._count(token_ids, log_probs)
            self._pending += self._detokenizer.push(token_ids)
            return self._release(final=False)
        released = []
        for index, token in enumerate(token_ids):
            self._count([token], log_probs[index : index + 1] if log_probs else None)
            self._pending += self._detokenizer.push([token])
            released.append(self._release(final=False))
            if self.stopped:
                break
        return "".join(released)

    def finish(self) -> str:
        """At the end of the generation: the text still held back."""
        if not self.stopped:
            self._pending += self._detokenizer.flush()
        return self._release(final=True)

    def _count(self, token_ids: list[int], log_probs: list[float] | None) -> None:
        self.tokens += len(token_ids)
        if self.with_logprobs:
            values = list(log_probs or [])
            for index, token in enumerate(token_ids):
                text = self._tokenizer.decode([token], skip_special_tokens=False)
                self.logprobs.append(TokenLogprob(text, values[index] if index < len(values) else float("nan")))

    def _possible_stop_start(self) -> int:
        """Length of the longest end of the pending text that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        if self._stops:
            cut = min((i for i in (self._pending.find(s) for s in self._stops) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                text, self._pending = self._pending[:cut], ""
                return text
        keep = 0 if final else self._possible_stop_start()
        text = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(text) :]
        return text
