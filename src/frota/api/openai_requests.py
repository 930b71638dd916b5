"""Pydantic models of the OpenAI request bodies a fleet accepts, and how a refusal names its field.

The fleet's endpoint validates a request the same way whatever the runtime: Frota's
worker parses every body with these models, and the router checks them in front of a
runtime that validates differently (vLLM, `frota router --validate-requests`).

Unknown fields are ignored (clients send `user`, `metadata`, ...); known fields
the engine cannot honour are rejected when set to a non-default value
(`unsupported()`, asked by the worker), so a client never silently gets something
other than what it asked for.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from frota.api.contract import ServingPath

# OpenAI's `max_tokens` for /v1/completions when the body leaves it out or sends null.
DEFAULT_COMPLETION_MAX_TOKENS = 16
# Seeds feed torch generators, which take 64-bit integers.
MAX_SEED = 2**63 - 1
MAX_N = 128
MAX_STOP = 16
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024


class _Body(BaseModel):
    """A part of a request body; fields the server does not know are ignored, as OpenAI's are."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    """`stream_options`: only `include_usage` changes anything."""

    include_usage: StrictBool = False


class SamplingFields(_Body):
    """Fields shared by completions and chat completions."""

    model: str = Field(min_length=1)
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = Field(None, ge=-MAX_SEED, le=MAX_SEED)
    temperature: StrictFloat | None = Field(None, ge=0.0, le=100.0, allow_inf_nan=False)
    top_p: StrictFloat | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt | None = Field(None, ge=-1, le=2**31 - 1)  # extension; 0 and -1 disable
    max_tokens: StrictInt | None = Field(None, ge=1, le=2**31 - 1)
    ignore_eos: StrictBool = False  # extension
    stop_token_ids: list[StrictInt] | None = Field(None, max_length=MAX_STOP)  # extension
    presence_penalty: StrictFloat | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: StrictFloat | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: StrictFloat | None = Field(None, gt=0.0, le=100.0,
                                                   allow_inf_nan=False)  # extension
    # Token id (as a string, the JSON object key) -> bias; ids beyond the vocabulary are
    # refused by the engine.
    logit_bias: dict[str, StrictFloat] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    min_tokens: StrictInt | None = Field(None, ge=0, le=2**31 - 1)  # extension
    best_of: StrictInt | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_biases(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias}")
        return v

    def token_biases(self) -> dict[int, float] | None:
        return {int(k): float(b) for k, b in self.logit_bias.items()} if self.logit_bias else None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str]:
        stops = [] if v is None else [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a set field the engine cannot honour, else None."""
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "`best_of` is not supported by this server; use `n`."
        return None


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`."""

    prompt: (
        Annotated[str, Field(max_length=10_000_000)]
        | list[StrictInt]
        | list[str]
        | list[list[StrictInt]]
    )
    # 0 only with `echo` (scoring the prompt: lm-evaluation-harness loglikelihoods).
    max_tokens: StrictInt | None = Field(DEFAULT_COMPLETION_MAX_TOKENS, ge=0, le=2**31 - 1)
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False
    suffix: str | None = None

    @field_validator("max_tokens")
    @classmethod
    def _default_when_null(cls, v: int | None) -> int:
        # OpenAI reads null as the default, 16: null must not mean "until the context ends".
        return DEFAULT_COMPLETION_MAX_TOKENS if v is None else v

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be an empty list")
            if any(isinstance(p, list) and not p for p in v):
                raise ValueError("token prompts must not be empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (OpenAI allows a batch)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def unsupported(self) -> tuple[str, str] | None:
        if self.max_tokens == 0 and not self.echo:
            return "max_tokens", "`max_tokens` must be at least 1 (0 is allowed with `echo`)."
        if self.suffix:
            return "suffix", "`suffix` is not supported by this server."
        return super().unsupported()


class TextPart(_Body):
    """A `{"type": "text", "text": ...}` content part."""

    type: Literal["text"]
    text: str


class FunctionDef(_Body):
    """A tool's function: its name and the JSON schema of its arguments."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Body):
    """One entry of `tools`."""

    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    type: Literal["function"]
    function: FunctionName


class ToolCallFunction(_Body):
    name: str
    arguments: str  # JSON text, as the API returns it


class ToolCall(_Body):
    """A tool call in an assistant message of the history."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


class ChatMessage(_Body):
    """One chat message; content may be a string or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(None, validate_default=True)
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    @field_validator("content")
    @classmethod
    def _content_required(cls, v: str | list[TextPart] | None,
                          info: ValidationInfo) -> str | list[TextPart] | None:
        # OpenAI: only an assistant message (with tool calls, or as a prefill) may go without
        # content; a null user or system message is a client bug, not an empty turn.
        role = info.data.get("role")
        if v is None and role in _CONTENT_REQUIRED:
            raise ValueError(f"content is required for a {role} message (got null or nothing)")
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1, le=2**31 - 1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None  # checked by frota.server.structured

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "`top_logprobs` requires `logprobs: true`."
        return super().unsupported()

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# The bodies by endpoint: what the router validates in front of another runtime.
REQUEST_MODELS: dict[str, type[SamplingFields]] = {
    ServingPath.COMPLETIONS: CompletionRequest,
    ServingPath.CHAT_COMPLETIONS: ChatCompletionRequest,
}


def loc_to_param(loc: tuple[int | str, ...]) -> str:
    """`("messages", 0, "role")` -> `"messages[0].role"`, the way OpenAI names params."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out:
            out = part
        else:
            out += f".{part}"
    return out


# Pydantic adds union-member tags ("str", "list[str]", "function-after[...]") to
# locations; they name schema branches, not request fields.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_field(part: int | str) -> bool:
    return isinstance(part, int) or (
        re.fullmatch(r"[a-z_][a-z0-9_]*", part) is not None and part not in _TYPE_TAGS
    )


def refusal(exc: ValidationError) -> tuple[str, str | None]:
    """(message, param) of the 400 for a body these models refused: the first error, with
    the field named as OpenAI names it."""
    first = exc.errors(include_url=False)[0]
    loc = tuple(p for p in first.get("loc", ()) if _is_field(p))
    param = loc_to_param(loc) or None
    msg = first.get("msg", "invalid value")
    where = f"`{param}`: " if param else ""
    return f"Invalid request field {where}{msg}.", param
