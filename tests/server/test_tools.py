"""Tool calls and the schema subset without a model: prompt rendering, parsing model output,
streamed tool-call chunks as the `openai` client assembles them, refused keywords."""

from __future__ import annotations

import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from frota.api.openai_requests import ChatCompletionRequest
from frota.server.errors import APIError
from frota.server.structured import response_format_constraint, unsupported_keywords
from frota.server.tools import ToolChatFormat, parse_tool_calls, plan, render_messages

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"q": "frota docs"}}\n</tool_call>'


def request(**fields) -> ChatCompletionRequest:  # type: ignore[no-untyped-def]
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_parse_returns_calls_and_the_text_before_them() -> None:
    content, calls = parse_tool_calls(f"Let me look.\n{CALL}\n{CALL}", {"lookup"})
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["lookup", "lookup"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": "frota docs"}
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    assert parse_tool_calls(CALL, {"lookup"})[0] is None


@pytest.mark.parametrize("text", [
    "no calls here",
    '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>',  # unknown tool
    '<tool_call>\n{"name": "lookup", "arguments": {"q": \n</tool_call>',  # broken JSON
])
def test_text_that_is_not_a_valid_call_stays_content(text: str) -> None:
    assert parse_tool_calls(text, {"lookup"}) == (text, [])


def _assemble(pieces: list[str], finish: str = "stop"):  # type: ignore[no-untyped-def]
    fmt = ToolChatFormat("chatcmpl-1", "m", 0, lambda ids: "", False,
                         tools=request(tools=[TOOL]).tools)
    state = ChatCompletionStreamState()
    chunks = fmt.opening_chunks(1)
    for i, piece in enumerate(pieces):
        chunks += fmt.chunks(0, piece, [], finish if i == len(pieces) - 1 else None)
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion().choices[0]


@pytest.mark.parametrize("cut", [1, 3, 7, 11])
def test_streamed_calls_assemble_into_the_same_calls(cut: int) -> None:
    text = "Sure. " + CALL
    pieces = [text[i:i + cut] for i in range(0, len(text), cut)]
    choice = _assemble(pieces)
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure. "
    [call] = choice.message.tool_calls
    assert call.function.name == "lookup"
    assert json.loads(call.function.arguments) == {"q": "frota docs"}


def test_streamed_text_that_only_looks_like_a_call_is_content() -> None:
    text = "a <tool_c> b <tool_call> not json"
    choice = _assemble([text[i:i + 4] for i in range(0, len(text), 4)])
    assert choice.message.content == text and not choice.message.tool_calls
    assert choice.finish_reason == "stop"


def test_history_renders_in_hermes_style() -> None:
    req = request(tools=[TOOL], messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "find docs"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "frota docs"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "docs/engine.md"},
    ])
    out = render_messages(req.messages, plan(req))
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.")
    assert "<tools>\n" + json.dumps(TOOL) + "\n</tools>" in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": CALL}
    assert out[3] == {"role": "user",
                      "content": "<tool_response>\ndocs/engine.md\n</tool_response>"}
    assert "<tools>" not in render_messages(req.messages, plan(
        request(tools=[TOOL], tool_choice="none")))[0]["content"]


def test_forced_calls_are_a_structural_tag_over_the_tool_schemas() -> None:
    assert plan(request(tools=[TOOL])).constraint() is None  # auto: the model may answer
    kind, text = plan(request(tools=[TOOL], tool_choice="required")).constraint()  # type: ignore[misc]
    tag = json.loads(text)
    assert kind == "structural_tag"
    [entry] = tag["format"]["tags"]
    assert entry["content"]["json_schema"] == TOOL["function"]["parameters"]
    assert entry["begin"] == '<tool_call>\n{"name": "lookup", "arguments": '
    with pytest.raises(APIError) as exc:
        plan(request(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "x"}}))
    assert exc.value.param == "tool_choice"


def test_unsupported_keywords_are_named_with_their_path() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "array", "uniqueItems": True, "items": {"oneOf": [{}, {}]}},
        "b": {"$ref": "#/$defs/b"}, "c": {"$ref": "other.json"}},
        "$defs": {"b": {"type": "string", "format": "email"}},
        "dependentRequired": {"a": ["b"]}, "title": "T", "description": "annotations pass"}
    bad = unsupported_keywords(schema)
    assert bad == ["properties.a.uniqueItems", "properties.a.items.oneOf",
                   "properties.c.$ref (only local references, '#/...', are supported)",
                   "$defs.b.format", "dependentRequired"]
    assert unsupported_keywords({"type": "object", "properties": {"x": {"anyOf": [
        {"type": "integer", "minimum": 0}, {"const": None}]}}}) == []


def test_response_format_kinds() -> None:
    assert response_format_constraint(None) is None
    assert response_format_constraint({"type": "text"}) is None
    assert response_format_constraint({"type": "json_object"}) == ("json_object", "")
    kind, text = response_format_constraint(  # type: ignore[misc]
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}})
    assert kind == "json_schema" and json.loads(text) == {"type": "integer"}
    for bad in ({"type": "yaml"}, {"type": "json_schema", "json_schema": {"name": "x"}}):
        with pytest.raises(APIError) as exc:
            response_format_constraint(bad)
        assert exc.value.param == "response_format"
