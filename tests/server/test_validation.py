"""Bad request bodies get OpenAI-shaped 400s that name the offending field."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient

from tests.server.conftest import MODEL

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body", "param"), [
    (COMP, {"model": MODEL}, "prompt"),
    (COMP, {"prompt": "x"}, "model"),
    (COMP, {"model": MODEL, "prompt": 5}, "prompt"),
    (COMP, {"model": MODEL, "prompt": []}, "prompt"),
    (COMP, {"model": MODEL, "prompt": ""}, "prompt"),
    (COMP, {"model": MODEL, "prompt": [-1]}, "prompt"),
    (COMP, {"model": MODEL, "prompt": [99999]}, "prompt"),
    (COMP, {"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
    (COMP, {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    (COMP, {"model": MODEL, "prompt": "x", "max_tokens": 10**30}, "max_tokens"),
    (COMP, {"model": MODEL, "prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    (COMP, {"model": MODEL, "prompt": "x", "max_tokens": "5"}, "max_tokens"),
    (COMP, {"model": MODEL, "prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    (COMP, {"model": MODEL, "prompt": "x", "n": 0}, "n"),
    (COMP, {"model": MODEL, "prompt": "x", "temperature": -1}, "temperature"),
    (COMP, {"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    (COMP, {"model": MODEL, "prompt": "x", "top_k": -5}, "top_k"),
    (COMP, {"model": MODEL, "prompt": "x", "stop": ""}, "stop"),
    (COMP, {"model": MODEL, "prompt": "x", "stop": [1]}, "stop"),
    (COMP, {"model": MODEL, "prompt": "x", "seed": 2**70}, "seed"),
    (COMP, {"model": MODEL, "prompt": "x", "logprobs": 21}, "logprobs"),
    (COMP, {"model": MODEL, "prompt": "x", "stream": "yes"}, "stream"),
    (COMP, {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": 3}},
     "stream_options.include_usage"),
    (COMP, {"model": MODEL, "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    (COMP, {"model": MODEL, "prompt": "x", "frequency_penalty": -3.0}, "frequency_penalty"),
    (COMP, {"model": MODEL, "prompt": "x", "repetition_penalty": 0.0}, "repetition_penalty"),
    (COMP, {"model": MODEL, "prompt": "x", "logit_bias": {"x": 1}}, "logit_bias"),
    (COMP, {"model": MODEL, "prompt": "x", "logit_bias": {"1": 101}}, "logit_bias"),
    (COMP, {"model": MODEL, "prompt": "x", "logit_bias": {"999999": 1}}, "logit_bias"),
    (COMP, {"model": MODEL, "prompt": "x", "max_tokens": 3, "min_tokens": 4}, "min_tokens"),
    (COMP, {"model": MODEL, "prompt": "x", "min_tokens": -1}, "min_tokens"),
    (CHAT, {"model": MODEL, "messages": []}, "messages"),
    (CHAT, {"model": MODEL}, "messages"),
    (CHAT, {"model": MODEL, "messages": "hi"}, "messages"),
    (CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
     "messages[0].role"),
    (CHAT, {"model": MODEL, "messages": [*USER, {"content": "x"}]}, "messages[1].role"),
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": 3}]},
     "messages[0].content"),
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": None}]},
     "messages[0].content"),
    (CHAT, {"model": MODEL, "messages": [{"role": "system", "content": None}, *USER]},
     "messages[0].content"),
    (CHAT, {"model": MODEL, "messages": [*USER, {"role": "user"}]}, "messages[1].content"),
    (CHAT, {"model": MODEL, "messages": USER, "max_completion_tokens": -3},
     "max_completion_tokens"),
    (CHAT, {"model": MODEL, "messages": USER, "logprobs": 2}, "logprobs"),
    (CHAT, {"model": MODEL, "messages": USER, "top_logprobs": 3}, "top_logprobs"),
    (CHAT, {"model": MODEL, "messages": USER, "tools": [{"type": "function"}]},
     "tools[0].function"),
    (CHAT, {"model": MODEL, "messages": USER, "tool_choice": "required"}, "tool_choice"),
    # The fake engine has no grammars: constrained decoding is refused, naming the field.
    (CHAT, {"model": MODEL, "messages": USER, "response_format": {"type": "json_object"}},
     "response_format"),
])
async def test_invalid_field_is_400_naming_it(client: TestClient, path: str, body: dict,
                                              param: str) -> None:
    resp = await client.post(path, json=body)
    assert resp.status == 400, await resp.text()
    error = (await resp.json())["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe", b"[]", b"null", b"42", b'"x"',
                                 b"[" * 100_000])
async def test_malformed_json_is_400(client: TestClient, raw: bytes) -> None:
    resp = await client.post(COMP, data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "body"


async def test_huge_body_is_413(client: TestClient) -> None:
    resp = await client.post(COMP, data=b"x" * (33 * 1024 * 1024))
    assert resp.status == 413
    assert "error" in await resp.json()


async def test_unknown_fields_are_ignored(client: TestClient) -> None:
    resp = await client.post(COMP, json={"model": MODEL, "prompt": "x", "max_tokens": 1,
                                         "user": "u1", "metadata": {"a": 1}})
    assert resp.status == 200


async def test_text_content_parts_and_developer_role_are_accepted(client: TestClient) -> None:
    messages = [{"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    resp = await client.post(CHAT, json={"model": MODEL, "messages": messages, "max_tokens": 1})
    assert resp.status == 200


async def test_wrong_method_is_openai_shaped(client: TestClient) -> None:
    resp = await client.get(COMP)
    assert resp.status == 405
    assert "error" in await resp.json()


@pytest.mark.parametrize(("field", "value"), [("temperature", True), ("temperature", "0.5"),
                                              ("top_p", "1"), ("n", 2.0), ("max_tokens", True)])
async def test_numbers_are_not_coerced_from_other_types(client: TestClient, field: str,
                                                        value: object) -> None:
    resp = await client.post(COMP, json={"model": MODEL, "prompt": "x", field: value})
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == field


async def test_an_assistant_message_with_tool_calls_may_have_null_content(
        client: TestClient) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    resp = await client.post(CHAT, json={"model": MODEL, "messages": messages, "max_tokens": 1})
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize("extra", [{}, {"max_tokens": None},
                                   {"max_tokens": None, "frobnicate": {"deep": [1, 2]}}])
async def test_completions_without_max_tokens_generate_openais_default_16(
        client: TestClient, extra: dict) -> None:
    # The fake engine never stops by itself: without the default it would run to the context end.
    resp = await client.post(COMP, json={"model": MODEL, "prompt": "x", **extra})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["usage"]["completion_tokens"] == 16
    assert body["choices"][0]["finish_reason"] == "length"


async def test_chat_without_max_tokens_still_runs_to_eos_not_16(engine, client: TestClient) -> None:
    engine.eos_after = 40
    resp = await client.post(CHAT, json={"model": MODEL, "messages": USER, "max_tokens": None})
    body = await resp.json()
    assert body["usage"]["completion_tokens"] == 41  # 40 letters, then EOS
    assert body["choices"][0]["finish_reason"] == "stop"
