"""Tool calling in the Hermes style: tools into the prompt, grammars for forced calls, calls
parsed back out of the text, and the chat format that returns them.

Prompt: a system preamble lists the tools as JSON inside `<tools></tools>`; the model answers
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (one block per call). History:
assistant tool calls are rendered as those blocks, `role: "tool"` results as user messages
holding `<tool_response>...</tool_response>`. `tool_choice` `required` or a named function is
enforced by a structural-tag grammar whose arguments follow each tool's parameters schema;
`auto` parses whatever the model wrote.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from frota.api.openai_requests import ChatCompletionRequest, ChatMessage, NamedToolChoice, Tool
from frota.server import errors
from frota.server.formats import ChatFormat, Choice, TokenLogprob
from frota.server.structured import check_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PREAMBLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class ToolPlan:
    """What a request's `tools` and `tool_choice` mean for this generation."""

    tools: list[Tool]
    choice: str  # "auto" | "required" | "named" | "none"
    named: str | None = None
    parallel: bool = False

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def constraint(self) -> tuple[str, str] | None:
        """A structural tag for `required` and named calls; None when the model may answer."""
        if self.choice not in ("required", "named"):
            return None
        tools = [t for t in self.tools if self.choice == "required" or t.function.name == self.named]
        tags = [{"type": "tag",
                 "begin": f'{OPEN}\n{{"name": {json.dumps(t.function.name)}, "arguments": ',
                 "content": {"type": "json_schema",
                             "json_schema": t.function.parameters or _ANY_OBJECT},
                 "end": f"}}\n{CLOSE}"} for t in tools]
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n",
               "at_least_one": True,
               "stop_after_first": self.choice == "named" or not self.parallel}
        return "structural_tag", json.dumps({"type": "structural_tag", "format": fmt},
                                            separators=(",", ":"), ensure_ascii=False)


def plan(req: ChatCompletionRequest) -> ToolPlan:
    """Check `tools` / `tool_choice`; 400 naming the field that is wrong."""
    tools = req.tools or []
    choice = req.tool_choice
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise errors.invalid("Tool names must be unique.", param="tools")
    for i, t in enumerate(tools):
        if t.function.parameters is not None:
            check_schema(t.function.parameters, "tools",
                         f"`tools[{i}].function.parameters` ({t.function.name})")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise errors.invalid(
                f"`tool_choice` names the function {choice.function.name!r}, which is not in "
                f"`tools` ({', '.join(names) or 'none given'}).", param="tool_choice")
        return ToolPlan(tools, "named", choice.function.name)
    if choice in ("required", "auto") and not tools:
        raise errors.invalid(f"`tool_choice: {choice}` needs `tools`.", param="tool_choice")
    # Several calls in one turn only when asked for: small models repeat a call until
    # max_tokens when the grammar lets them go on.
    return ToolPlan(tools, choice or ("auto" if tools else "none"),
                    parallel=req.parallel_tool_calls is True)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def render_messages(messages: list[ChatMessage], tool_plan: ToolPlan) -> list[dict[str, str]]:
    """The messages as plain role/content dicts for the chat template, tools included."""
    out: list[dict[str, str]] = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role  # templates know only "system"
        content = m.text()
        if m.role == "assistant" and m.tool_calls:
            calls = [f"{OPEN}\n" + json.dumps({"name": c.function.name,
                                               "arguments": _arguments(c.function.arguments)},
                                              ensure_ascii=False) + f"\n{CLOSE}"
                     for c in m.tool_calls]
            content = "\n".join([content, *calls] if content else calls)
        elif m.role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if tool_plan.active:
        listed = "\n".join(json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False)
                           for t in tool_plan.tools)
        preamble = PREAMBLE.format(tools=listed)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{preamble}"}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out


def parse_tool_calls(text: str, known: set[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) from model output; no calls when any block is not a valid call
    of a known tool (the text is then all content)."""
    start = text.find(OPEN)
    if start < 0:
        return text, []
    calls = []
    for match in _CALL.finditer(text, start):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            return text, []
        args = call.get("arguments", call.get("parameters")) if isinstance(call, dict) else None
        if not isinstance(args, dict) or call.get("name") not in known:
            return text, []
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(args, ensure_ascii=False)}})
    content = text[:start].strip()
    return content or None, calls


def _held_back(text: str) -> int:
    """Length of the longest suffix of `text` that could begin `<tool_call>`."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


@dataclass
class _Stream:
    text: str = ""  # everything generated
    emitted: int = 0  # characters of `text` sent as content
    in_call: bool = False
    extra: list[dict[str, Any]] = field(default_factory=list)


class ToolChatFormat(ChatFormat):
    """Chat replies that may carry `message.tool_calls` (finish_reason "tool_calls").

    Streamed: content flows as usual until `<tool_call>` appears (text that could be its
    start is held back); the calls are sent when the choice finishes, one `delta.tool_calls`
    entry per call (id, type, name, then the arguments in pieces), as the OpenAI client's
    stream helpers assemble them."""

    ARGUMENT_PIECE = 16

    def __init__(self, *args: Any, tools: list[Tool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.known = {t.function.name for t in tools}
        self.streams: dict[int, _Stream] = {}

    def chunks(self, index: int, text: str, logprobs: list[TokenLogprob],
               finish_reason: str | None) -> list[dict[str, Any]]:
        s = self.streams.setdefault(index, _Stream())
        s.text += text
        out = []
        if not s.in_call and (at := s.text.find(OPEN, s.emitted)) >= 0:
            s.in_call = True
            end = at
        elif not s.in_call:
            end = len(s.text) - (0 if finish_reason else _held_back(s.text))
        else:
            end = s.emitted
        calls: list[dict[str, Any]] = []
        if finish_reason is not None and s.in_call:
            _, calls = parse_tool_calls(s.text, self.known)
            if not calls:  # not a valid call after all: it was content
                end = len(s.text)
        piece = s.text[s.emitted:end]
        s.emitted = max(s.emitted, end)
        if piece or (logprobs and not s.in_call):
            out.append(self.chunk(index, piece, logprobs, None))
        for i, call in enumerate(calls):
            args = call["function"]["arguments"]
            head = {"index": i, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}
            out.append(self._tool_delta(index, head))
            for k in range(0, len(args), self.ARGUMENT_PIECE):
                out.append(self._tool_delta(index, {
                    "index": i, "function": {"arguments": args[k:k + self.ARGUMENT_PIECE]}}))
        if finish_reason is not None:
            reason = "tool_calls" if calls and finish_reason == "stop" else finish_reason
            out.append(self.chunk(index, "", [], reason))
        return out

    def _tool_delta(self, index: int, call: dict[str, Any]) -> dict[str, Any]:
        choice = {"index": index, "delta": {"tool_calls": [call]}, "logprobs": None,
                  "finish_reason": None}
        return {**self._envelope(self.chunk_object_name), "choices": [choice]}

    def body(self, choices: list[Choice], usage_: dict[str, int]) -> dict[str, Any]:
        reply = super().body(choices, usage_)
        for choice, out in zip(choices, reply["choices"], strict=True):
            content, calls = parse_tool_calls(choice.text, self.known)
            if calls:
                out["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                if choice.finish_reason == "stop":
                    out["finish_reason"] = "tool_calls"
        return reply
