"""One request's answer on its way: its n choices (each a Triton request of its own, sent with the same prompt), and
the response they make together, one JSON body or SSE events.

Streamed, each choice's chunks carry its index and leave as they come, the choices interleaved (as OpenAI's and
vLLM's servers send them): a chat stream starts with one role chunk per choice, and ends with the usage (when
asked) and [DONE] once every choice has finished. Usage counts the prompt once and the completion tokens of every
choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass, field

import orjson

from .protocol import ApiError
from .text_stream import TextStream, TokenLogprob
from .tools import ToolCallText
from .triton_pool import Delta, TritonGeneration

# Tool-call text up to this many characters is parsed on the event loop (linear: well under a millisecond); a longer
# answer in a worker thread.
INLINE_TOOL_PARSE_CHARS = 16384
DONE = b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"  # orjson: one C call, where json.dumps builds an encoder


@dataclass(slots=True)
class Choice:
    """One of the request's n sequences: its Triton request and the text it makes."""

    index: int
    text: TextStream
    triton: TritonGeneration
    calls: ToolCallText | None = None  # the answer may hold tool calls
    first: Delta | None = None  # set once it comes, before the response starts

    def push(self, delta: Delta) -> str:
        """The text this delta releases (token ids, or a text model's text)."""
        if delta.text is not None:
            return self.text.push_text(delta.text)
        return self.text.push(delta.token_ids, delta.log_probs, delta.top_log_probs)

    async def finish_calls(self) -> tuple[str, list[dict]]:
        """The held text and the tool calls in it; a long answer parsed off the event loop."""
        if self.calls.held_chars > INLINE_TOOL_PARSE_CHARS:
            return await asyncio.to_thread(self.calls.finish)
        return self.calls.finish()

    def finish_reason(self, delta: Delta, calls: list | None = None) -> str | None:
        if calls:
            return "tool_calls"
        return "stop" if self.text.stopped else delta.finish_reason


@dataclass(slots=True)
class Generation:
    """What the chat and the completions shapes share: the request's identity, its choices, usage."""

    id: str
    created: int
    model: str
    prompt_tokens: int
    chat: bool
    include_usage: bool
    continuous_usage: bool = False  # usage in every chunk (vLLM's stream_options.continuous_usage_stats)
    top_logprobs: int = 0  # alternatives per token in the log probs (chat top_logprobs, completions logprobs)
    choices: list[Choice] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return sum(choice.text.tokens for choice in self.choices)

    def usage(self) -> dict:
        completion = self.completion_tokens
        # The prompt is counted once; its cached part is what the first choice found (the others then find it all).
        cached = self.choices[0].triton.cached_tokens if self.choices else 0
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": min(cached, self.prompt_tokens)}}

    def close(self) -> None:
        """Every choice's Triton request: ended ones give their call back, the others are cancelled."""
        for choice in self.choices:
            choice.triton.close()

    # -- log probs ----------------------------------------------------------------------------------------------
    def logprobs(self, choice: Choice, start: int, text_offset: int = 0) -> dict | None:
        """Log probabilities of the tokens the choice counted since `start`, in the endpoint's shape."""
        if not choice.text.with_logprobs:
            return None
        entries = choice.text.logprobs[start:]
        if self.chat:
            return {"content": [_chat_entry(e) for e in entries], "refusal": None}
        offsets, position = [], text_offset
        for entry in entries:
            offsets.append(position)
            position += len(entry.token)
        top = [_completion_top(e) for e in entries] if self.top_logprobs else None
        return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": top, "text_offset": offsets}

    # -- streamed -----------------------------------------------------------------------------------------------
    def chunk(self, index: int, text: str | None, finish_reason: str | None, logprobs: dict | None,
              role: bool = False) -> bytes:
        if self.chat:
            delta: dict = {"role": "assistant", "content": text or ""} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            payload = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                       "choices": [choice]}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
            payload = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                       "choices": [choice]}
        if self.include_usage:
            payload["usage"] = self.usage() if self.continuous_usage else None
        return event(payload)

    def tool_call_chunks(self, index: int, calls: list[dict]) -> list[bytes]:
        """OpenAI's streamed calls: each call's id and name (arguments ""), then its arguments."""
        chunks = []
        for position, call in enumerate(calls):
            function = call["function"]
            for delta in ({"index": position, "id": call["id"], "type": "function",
                           "function": {"name": function["name"], "arguments": ""}},
                          {"index": position, "function": {"arguments": function["arguments"]}}):
                payload = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.model,
                           "choices": [{"index": index, "delta": {"tool_calls": [delta]}, "logprobs": None,
                                        "finish_reason": None}]}
                if self.include_usage:
                    payload["usage"] = self.usage() if self.continuous_usage else None
                chunks.append(event(payload))
        return chunks

    def usage_chunk(self) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return event({"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [],
                      "usage": self.usage()})

    async def sse(self) -> AsyncIterator[bytes]:
        """The SSE body: the role first (chat, one chunk per choice), content as it comes, each choice's finish
        reason, usage, [DONE]."""
        try:
            if self.chat:
                for choice in self.choices:
                    yield self.chunk(choice.index, "", None, None, role=True)
            if len(self.choices) == 1:
                async for chunk in self._choice_events(self.choices[0]):
                    yield chunk
            else:
                async for chunk in _interleaved([self._choice_events(choice) for choice in self.choices]):
                    yield chunk
            if self.include_usage:
                yield self.usage_chunk()
            yield DONE
        except ApiError as error:
            yield event(error.body())
        finally:
            self.close()  # before the final delta: cancels the Triton requests

    async def _choice_events(self, choice: Choice) -> AsyncIterator[bytes]:
        """One choice's chunks: content as it comes, then its finish reason."""
        counted, offset = 0, 0
        delta = choice.first
        while True:
            text = choice.push(delta)
            end = delta.finish_reason is not None or choice.text.stopped
            if end:
                text += choice.text.finish()
            calls: list[dict] = []
            if choice.calls is not None:
                text = choice.calls.push(text)
                if end:
                    rest, calls = await choice.finish_calls()
                    text += rest
            logprobs = self.logprobs(choice, counted, offset) if text or end else None
            if logprobs is not None:
                counted, offset = len(choice.text.logprobs), offset + len(text)
            if end:
                if text:
                    yield self.chunk(choice.index, text, None, logprobs)
                    logprobs = None
                for chunk in self.tool_call_chunks(choice.index, calls):
                    yield chunk
                yield self.chunk(choice.index, None, choice.finish_reason(delta, calls), logprobs)
                return
            if text:
                yield self.chunk(choice.index, text, None, logprobs)
            delta = await choice.triton.next_delta()

    # -- whole --------------------------------------------------------------------------------------------------
    async def body(self) -> dict:
        """The whole response of a non-streamed request (the caller closes the Triton requests)."""
        if len(self.choices) == 1:
            choices = [await self._choice_body(self.choices[0])]
        else:
            choices = await gather_all(self._choice_body(choice) for choice in self.choices)
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                "usage": self.usage()}

    async def _choice_body(self, choice: Choice) -> dict:
        parts = []
        delta = choice.first
        while True:
            parts.append(choice.push(delta))
            if delta.finish_reason is not None or choice.text.stopped:
                parts.append(choice.text.finish())
                break
            delta = await choice.triton.next_delta()
        text = "".join(parts)
        calls: list[dict] = []
        if choice.calls is not None:
            text = choice.calls.push(text)
            rest, calls = await choice.finish_calls()
            text += rest
        finish = choice.finish_reason(delta, calls)
        if self.chat:
            message: dict = {"role": "assistant", "content": text or (None if calls else "")}
            if calls:
                message["tool_calls"] = calls
            return {"index": choice.index, "message": message, "logprobs": self.logprobs(choice, 0),
                    "finish_reason": finish}
        return {"index": choice.index, "text": text, "logprobs": self.logprobs(choice, 0), "finish_reason": finish}


def _chat_entry(entry: TokenLogprob) -> dict:
    top = [{"token": token, "bytes": list(token.encode()), "logprob": logprob} for token, logprob in entry.top or ()]
    return {"token": entry.token, "bytes": list(entry.token.encode()), "logprob": entry.logprob, "top_logprobs": top}


def _completion_top(entry: TokenLogprob) -> dict[str, float]:
    """The legacy shape: token -> log prob, the likeliest first, and the sampled token's always (OpenAI's)."""
    top = dict(entry.top or ())
    top.setdefault(entry.token, entry.logprob)
    return top


async def gather_all(work: Iterable[Awaitable]) -> list:
    """Every result, in order; the first failure is raised, and the rest of the work stops."""
    tasks = [asyncio.ensure_future(item) for item in work]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


_END = object()


async def _interleaved(streams: list[AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """The streams' items in the order they come; the first error (an ApiError: Triton's, for one choice) ends
    them all."""
    queue: asyncio.Queue = asyncio.Queue()  # bounded by the choices' own pace: Triton sends no faster

    async def pump(stream: AsyncIterator[bytes]) -> None:
        try:
            async for item in stream:
                queue.put_nowait(item)
            queue.put_nowait(_END)
        except Exception as exc:  # noqa: BLE001 - raised again by the reader, which ends every stream
            queue.put_nowait(exc)

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
