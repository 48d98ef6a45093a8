"""An `execute()` batch's requests parsed together, with their text prompts tokenized in one call.

A convention's `request_parser` is its request parsing as a generator that stops once, at the text prompt: it yields
the `Prompt` to tokenize and is sent the prompt's token ids (a request that brings token ids, or a stop request,
finishes without stopping). `parse_together` runs every parser of a batch to its prompt, tokenizes the prompts with
`encode_texts` (the Rust tokenizer's `encode_batch`, which works with the interpreter's lock let go), and finishes each
parser. Each prompt is still checked for size before it is tokenized: that happens in the parser, before it yields.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from ..executor_interface import Tokenizer
from ..pipeline.text_encoding import encode_text, encode_texts
from .common import ParsedRequest


@dataclass(frozen=True, slots=True)
class Prompt:
    """A text prompt to tokenize. A chat prompt's template wrote its special tokens, so it is encoded without."""

    text: str
    add_special_tokens: bool


RequestParser = Generator[Prompt, list[int], ParsedRequest]


def parse_together(parsers: list[RequestParser], tokenizer: Tokenizer | None) -> list[ParsedRequest | Exception]:
    """Each parser's request, or the exception that ended it: one request's bad input fails that request alone."""
    outcomes: list[ParsedRequest | Exception | None] = [None] * len(parsers)
    waiting: dict[bool, list[tuple[int, str]]] = {True: [], False: []}  # by add_special_tokens: (parser, text)
    for index, parser in enumerate(parsers):
        try:
            prompt = next(parser)
        except StopIteration as done:
            outcomes[index] = done.value
        except Exception as exc:
            outcomes[index] = exc
        else:
            waiting[prompt.add_special_tokens].append((index, prompt.text))
    for add_special_tokens, prompts in waiting.items():
        if not prompts:
            continue
        try:
            encoded = encode_texts(tokenizer, [text for _, text in prompts], add_special_tokens)
        except Exception:  # then one at a time, so that only a prompt the tokenizer refuses fails
            encoded = None
        for position, (index, text) in enumerate(prompts):
            try:
                ids = encoded[position] if encoded is not None else encode_text(tokenizer, text, add_special_tokens)
                parsers[index].send(ids)
                outcomes[index] = RuntimeError("a request parser stopped twice")
            except StopIteration as done:
                outcomes[index] = done.value
            except Exception as exc:
                outcomes[index] = exc
    return outcomes


def parse_alone(parser: RequestParser, tokenizer: Tokenizer | None) -> ParsedRequest:
    """One request's parser run to its end; raises what ended it."""
    outcome = parse_together([parser], tokenizer)[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome
