"""OpenAI's request bodies (validated with pydantic) and its error JSON.

Field names follow OpenAI's API reference for /v1/chat/completions and /v1/completions, plus vLLM's `ignore_eos`
and `min_tokens` (benchmark clients send them). `response_format` and `tools` become a guide for the model
(tools.py). Fields that would change what the model does but that we cannot honour (logit_bias, echo, ...) are
refused with a 400 naming them; fields that only describe the caller (`user`, `metadata`, ...) are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# OpenAI allows at most this many stop strings.
MAX_STOP_STRINGS = 4
# Token counts and token ids travel to Triton as INT32 tensors: a value past these bounds is the caller's error (400).
INT32_MAX = 2**31 - 1
TokenCount = Annotated[int, Field(ge=1, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class ApiError(Exception):
    """An error the frontend answers with OpenAI's error JSON and an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        """OpenAI's error type: every refusal of the request itself (4xx, a wrong method too) is invalid_request_error."""
        if self.status == 429:
            return "rate_limit_error"
        if 400 <= self.status < 500:
            return "invalid_request_error"
        return "service_unavailable_error" if self.status == 503 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk (AIPerf and guidellm send it)


class _Sampling(_Body):
    """Parameters both endpoints share."""

    model: str
    max_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # 0: only the likeliest token (greedy)
    seed: Annotated[int, Field(ge=0, lt=2**64)] | None = None
    stop: str | list[str] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    n: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1  # choices: bounded by the model (app._check_choices)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False  # vLLM's: generate max_tokens whatever the model would end with
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None  # vLLM's: no end before this many tokens

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"{len(stops)} stop strings: at most {MAX_STOP_STRINGS} are allowed")
        return stops

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    def check_supported(self) -> None:
        if self.logit_bias:
            raise ApiError(400, "logit_bias: not supported", "logit_bias", "unsupported_parameter")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options: only allowed with stream=true", "stream_options", "invalid_value")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Body):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # tool_choice auto: any number of calls, or the first only (false); required or named: one call, or (true) a
    # list of one or more.
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    response_format: ResponseFormat | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.functions:
            raise ApiError(400, "functions: deprecated by OpenAI; send tools", "functions", "unsupported_parameter")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ApiError(400, "tool_choice: needs tools", "tool_choice", "invalid_value")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [tool.function.name for tool in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ApiError(400, f"tool_choice: no tool named {self.tool_choice.function.name!r} among "
                               f"{names}", "tool_choice", "invalid_value")
        response_format = self.response_format
        if response_format is not None and response_format.type == "json_schema" and response_format.json_schema is None:
            raise ApiError(400, "response_format.json_schema: required with type json_schema", "response_format",
                           "invalid_value")
        if self.tools and self.response_format is not None and self.response_format.type != "text" and (
            self.tool_choice not in (None, "none")
        ):
            raise ApiError(400, "response_format: give it or a tool_choice that calls tools, not both",
                           "response_format", "invalid_value")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ApiError(400, "max_tokens and max_completion_tokens: give one of them", "max_tokens", "invalid_value")

    def output_limit(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class CompletionRequest(_Sampling):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None  # the likeliest tokens' too (OpenAI: 5, vLLM: 20)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise ApiError(400, "echo: not supported", "echo", "unsupported_parameter")
        if self.best_of not in (None, self.n):  # ranking more sequences than are returned: not done here
            raise ApiError(400, f"best_of={self.best_of}: only best_of equal to n ({self.n}) is supported", "best_of",
                           "unsupported_value")
        if self.suffix:
            raise ApiError(400, "suffix: not supported", "suffix", "unsupported_parameter")

    def output_limit(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"

    def single_prompt(self) -> str | list[int]:
        """The one prompt: a string or token ids (a list holding one of those is that one)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, f"prompt: {len(prompt)} prompts; send one prompt per request", "prompt",
                               "unsupported_value")
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "prompt: the prompt is empty", "prompt", "invalid_value")
        return prompt


def parse_body(raw: bytes, model: type[_Body]) -> Any:
    """The validated request, or an ApiError(400) naming the offending field."""
    try:
        request = model.model_validate_json(raw)  # pydantic parses the JSON too: one pass, no dict in between
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        # A field with several accepted shapes (prompt) fails once per shape: name the one that got furthest, a
        # value out of range rather than "should be a valid string".
        first = max((e for e in errors if e["loc"][:1] == first["loc"][:1]),
                    key=lambda e: (not e["type"].endswith(("_type", "_parsing")), len(e["loc"])))
        if first["type"] == "json_invalid":
            reason = first["msg"].removeprefix("Invalid JSON: ")
            raise ApiError(400, f"the request body is not valid JSON: {reason}", None, "invalid_json") from None
        if not first["loc"]:
            raise ApiError(400, "the request body must be a JSON object", None, "invalid_json") from None
        location = [str(part) for part in first["loc"]]
        # Union members repeat the field's path with the type tried (e.g. prompt.str): keep the path.
        param = ".".join(p for p in location if not p.startswith(("str", "list[", "int", "float", "dict")))
        reason = first["msg"].removeprefix("Value error, ")  # pydantic's wording for a validator's ValueError
        raise ApiError(400, f"{param or 'body'}: {reason}", param or None, "invalid_value") from None
    request.check_supported()
    return request
