"""OpenAI's `response_format` and `tools` as a guide for the model (NVIDIA's guided_decoding_guide_type /
guided_decoding_guide), and the model's text back as OpenAI's `tool_calls`.

The model writes a call as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, the convention of the
Hermes / Qwen chat templates; a template that renders no tools (SmolLM2's) gets them in a system message in those
words. Per `tool_choice`:
  none      no guide; the text is the answer
  auto      a structural tag: the text is free until the model opens a call, which then must name a tool and give
            arguments that validate against its parameters
  required  a JSON schema: the whole answer is one call `{"name": ..., "arguments": ...}` to one of the tools
  named     the same, with that one tool
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from .protocol import ChatRequest, NamedToolChoice, Tool

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(slots=True)
class Guide:
    type: str  # NVIDIA's guided_decoding_guide_type
    guide: str | None
    param: str  # the OpenAI parameter it came from (a guide that does not compile is a 400 naming it)


def call_text(name: str, arguments: str) -> str:
    """A call as the model writes it (also how an earlier call in the conversation is shown to it)."""
    return f'{CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}\n{CALL_CLOSE}'


def conversation(request: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages as a chat template takes them. `developer` is the newer name of `system`; chat
    templates know only the latter. Earlier tool calls go to the template as OpenAI's fields, and as the text the
    model wrote for them (`call_text`)."""
    messages = []
    for m in request.messages:
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in m.tool_calls]
            message["content"] += "".join(call_text(call.function.name, call.function.arguments)
                                          for call in m.tool_calls)
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    return messages


def tools_system_text(tools: list[Tool]) -> str:
    """The tools in words, for a chat template that renders none."""
    signatures = "\n".join(json.dumps(tool.model_dump(exclude_none=True)) for tool in tools)
    return (
        "You can call these tools (their signatures in JSON, inside <tools></tools>):\n"
        f"<tools>\n{signatures}\n</tools>\n"
        f"To call one, answer with its name and arguments in JSON between {CALL_OPEN} and {CALL_CLOSE}:\n"
        + call_text("<tool name>", "<arguments as a JSON object>")
    )


def mode(request: ChatRequest) -> str:
    """none, auto or forced (required or named)."""
    if not request.tools or request.tool_choice == "none":
        return "none"
    return "auto" if request.tool_choice in (None, "auto") else "forced"


def guide_of(request: ChatRequest) -> Guide | None:
    """The guide this request's response_format or tools ask for; None: the model writes freely."""
    calls = mode(request)
    if calls == "forced":
        tools = request.tools or []
        if isinstance(request.tool_choice, NamedToolChoice):
            tools = [tool for tool in tools if tool.function.name == request.tool_choice.function.name]
        choices = [_call_schema(tool) for tool in tools]
        schema = choices[0] if len(choices) == 1 else {"anyOf": choices}
        if request.parallel_tool_calls:  # asked for explicitly: one or more calls, as a JSON list
            schema = {"type": "array", "items": schema, "minItems": 1}
        return Guide("json_schema", json.dumps(schema), "tools")
    if calls == "auto":
        structures = [{"begin": f'{CALL_OPEN}\n{{"name": {json.dumps(tool.function.name)}, "arguments": ',
                       "schema": tool.function.parameters, "end": f"}}\n{CALL_CLOSE}"} for tool in request.tools or []]
        return Guide("structural_tag", json.dumps({"structures": structures, "triggers": [CALL_OPEN]}), "tools")
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Guide("json", None, "response_format")
    schema = response_format.json_schema.schema_ if response_format.json_schema else None
    return Guide("json_schema", json.dumps(schema if schema is not None else {"type": "object"}), "response_format")


def _call_schema(tool: Tool) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": tool.function.name},
                                             "arguments": tool.function.parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def _openai_call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


class ToolCallText:
    """Splits the answer's text into content and calls as it streams: content is released as it comes (text that
    may be the start of a call held back), a call only once the answer has ended."""

    def __init__(self, forced: bool, parallel: bool | None = None) -> None:
        self.forced = forced
        self.parallel = parallel  # OpenAI's parallel_tool_calls: False keeps the first call only
        self._text = ""  # not yet released
        self._in_calls = forced  # a forced answer is all call

    @property
    def held_chars(self) -> int:
        return len(self._text)

    def push(self, text: str) -> str:
        """The content this text releases."""
        self._text += text
        if self._in_calls:
            return ""
        start = self._text.find(CALL_OPEN)
        if start >= 0:
            content, self._text, self._in_calls = self._text[:start], self._text[start:], True
            return content
        keep = next((n for n in range(min(len(CALL_OPEN) - 1, len(self._text)), 0, -1)
                     if CALL_OPEN.startswith(self._text[-n:])), 0)
        content, self._text = self._text[: len(self._text) - keep], self._text[len(self._text) - keep :]
        return content

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """At the end: the content still held, and the calls (OpenAI's tool_calls entries)."""
        text, self._text = self._text, ""
        if not self._in_calls:
            return text, []
        if self.forced:
            call = _json_or_none(text)
            # parallel_tool_calls=true: the guide asked for a list of one or more calls.
            entries = call if isinstance(call, list) and call else [call]
            if all(isinstance(entry, dict) and "name" in entry for entry in entries):
                return "", [_openai_call(entry["name"], entry.get("arguments", {})) for entry in entries]
            return text, []  # cut short (length): what the model wrote, as text
        calls, rest = [], []
        for whole, body in _call_spans(text):
            call = _json_or_none(body)
            if isinstance(call, dict) and "name" in call:
                calls.append(_openai_call(call["name"], call.get("arguments", {})))
            else:
                rest.append(whole)
        if self.parallel is False:
            calls = calls[:1]
        return "".join(rest), calls


def _call_spans(text: str) -> list[tuple[str, str]]:
    """Each `<tool_call>...</tool_call>` (the last may be unclosed) as (its whole text, its body): found with
    str.find, one pass over the text, where a regex with a lazy body between \\s* ran in time quadratic in the
    whitespace of a body."""
    spans, position = [], 0
    while (start := text.find(CALL_OPEN, position)) >= 0:
        body_start = start + len(CALL_OPEN)
        end = text.find(CALL_CLOSE, body_start)
        stop = len(text) if end < 0 else end + len(CALL_CLOSE)
        spans.append((text[start:stop], text[body_start : len(text) if end < 0 else end]))
        position = stop
    return spans


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
