"""Incremental detokenization for streamed text, and the chat template for a single user message.

`IncrementalDetokenizer` turns a stream of token ids into text deltas whose concatenation is exactly
`tokenizer.decode(all_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)`: special tokens (such
as `<|im_end|>`) are left out, as in NVIDIA's postprocessing model, and no clean-up rewrites spaces (it is not
incremental: it would change text already sent). Each push decodes a short window of tokens:
- the window starts at a token whose text was already sent, so a tokenizer that drops the leading space of the
  first token it decodes (SentencePiece) still puts the space in the delta;
- while the window's text ends with U+FFFD the last token ended inside a multi-byte character: that tail is held
  back until a later token completes it, or `flush` sends it at the end of the stream.
The window restarts at the last token whenever everything is sent, so a push costs one decode of a few tokens: the
restarted window's text length is that one token's, kept by token id (a model's detokenizers share the table).
"""

from __future__ import annotations

from ..executor_interface import Tokenizer
from .text_encoding import encode_text

REPLACEMENT_CHAR = "\ufffd"
# A window that grows past this many tokens while its end is still an unfinished character (a run of invalid
# bytes, never in real text) sends all but its last U+FFFD: in byte-level decoding (GPT-2 style, SmolLM2) later
# bytes can only change that one.
MAX_WINDOW_TOKENS = 64
# Token ids whose decoded length a table keeps (a vocabulary's worth of small ints: a few MiB at most).
MAX_KEPT_LENGTHS = 262_144


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True,
                 token_lengths: dict[int, int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # len(decode([id])) by token id, for this tokenizer and skip_special_tokens; shareable between detokenizers.
        self._lengths = {} if token_lengths is None else token_lengths
        self._window: list[int] = []
        self._sent = 0  # characters of decode(window) already returned
        self._held = 0  # characters of decode(window) not returned yet

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def push(self, token_ids: list[int]) -> str:
        """Add generated tokens; returns the text they complete (may be empty)."""
        self._window.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the stream: the text still held back."""
        return self._advance(final=True) if self._held else ""

    def _advance(self, final: bool) -> str:
        text = self._decode(self._window)
        end = len(text)
        if not final:
            end -= len(text) - len(text.rstrip(REPLACEMENT_CHAR))
            if end < len(text) and len(self._window) > MAX_WINDOW_TOKENS:
                end = len(text) - 1
        delta = text[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        self._held = len(text) - self._sent
        if self._held == 0:
            self._restart_window(keep=1)
        elif len(self._window) > MAX_WINDOW_TOKENS:
            # A held character's bytes (at most 3) lie within the last 3 tokens.
            self._restart_window(keep=3)
        return delta

    def _restart_window(self, keep: int) -> None:
        if len(self._window) <= keep:  # already that window (a stream's first token): no decode needed
            return
        self._window = self._window[-keep:]
        if keep == 1:  # every push that sent everything: the token's length, not a second decode a response
            self._sent = self._token_length(self._window[0]) - self._held
        else:
            self._sent = len(self._decode(self._window)) - self._held

    def _token_length(self, token_id: int) -> int:
        length = self._lengths.get(token_id)
        if length is None:
            length = len(self._decode([token_id]))
            if len(self._lengths) < MAX_KEPT_LENGTHS:
                self._lengths[token_id] = length
        return length


def chat_prompt_text(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The conversation through the model's chat template, ready for the assistant's answer: the one rendering both
    the `apply_chat_template` input and the OpenAI frontend use. Encode it with `add_special_tokens=False`: the
    template writes the special tokens (BOS included) itself, and a tokenizer that adds a BOS of its own (Llama's)
    would otherwise begin the prompt with two."""
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def chat_prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """`chat_prompt_text` as token ids."""
    return encode_text(tokenizer, chat_prompt_text(tokenizer, messages, tools), add_special_tokens=False)
