"""Penalties, logit_bias, min_tokens and echo reach the engine and come back OpenAI-shaped."""

from __future__ import annotations

import json

from aiohttp.test_utils import TestClient

from tests.server.conftest import MODEL
from tests.server.fake_engine import FakeEngine


def completion(**kw: object) -> dict:
    return {"model": MODEL, "prompt": "abc", "max_tokens": 3, "temperature": 0, **kw}


async def test_sampling_fields_reach_the_engine(client: TestClient, engine: FakeEngine) -> None:
    resp = await client.post("/v1/completions", json=completion(
        presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.2,
        logit_bias={"100": -100, "7": 2.5}, min_tokens=2))
    assert resp.status == 200, await resp.text()
    params = engine.requests[-1][2]
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (
        0.5, -1.0, 1.2)
    assert params.logit_bias == {100: -100.0, 7: 2.5}
    assert params.min_tokens == 2
    assert params.prompt_logprobs is None


async def test_defaults_leave_the_engine_params_untouched(client: TestClient,
                                                          engine: FakeEngine) -> None:
    await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    params = engine.requests[-1][2]
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty,
            params.logit_bias, params.min_tokens) == (0.0, 0.0, 1.0, None, 0)


async def test_echo_with_logprobs_covers_the_prompt_then_the_completion(
        client: TestClient) -> None:
    body = await (await client.post("/v1/completions",
                                    json=completion(echo=True, logprobs=1))).json()
    choice = body["choices"][0]
    assert choice["text"] == "abc" + "def"
    lp = choice["logprobs"]
    assert lp["tokens"] == list("abcdef")
    assert lp["token_logprobs"][:3] == [None, -0.1, -0.2]
    assert lp["top_logprobs"][0] is None and lp["top_logprobs"][1] == {"b": -0.1}
    assert lp["text_offset"] == [0, 1, 2, 3, 4, 5]
    assert body["usage"]["completion_tokens"] == 3


async def test_echo_with_max_tokens_zero_scores_the_prompt_only(client: TestClient,
                                                                engine: FakeEngine) -> None:
    body = await (await client.post("/v1/completions", json=completion(
        prompt=[ord("x"), ord("y")], echo=True, logprobs=0, max_tokens=0))).json()
    choice = body["choices"][0]
    assert choice["text"] == "xy" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["token_logprobs"] == [None, -0.1]
    assert choice["logprobs"]["top_logprobs"] == [None, {}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}
    assert engine.requests[-1][2].prompt_logprobs == 0


async def test_echo_without_logprobs_only_prepends_the_prompt(client: TestClient,
                                                              engine: FakeEngine) -> None:
    body = await (await client.post("/v1/completions", json=completion(echo=True, n=2))).json()
    assert sorted(c["text"] for c in body["choices"]) == ["abcdef", "abcdef"]
    assert all(c["logprobs"] is None for c in body["choices"])
    assert engine.requests[-1][2].prompt_logprobs is None


async def test_streamed_echo_leads_with_the_prompt(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json=completion(echo=True, logprobs=0,
                                                                stream=True))
    events = []
    async for line in resp.content:
        line = line.decode().strip()
        if line.startswith("data: {"):
            events.append(json.loads(line[len("data: "):]))
    first = events[0]["choices"][0]
    assert first["text"] == "abcd"
    assert first["logprobs"]["token_logprobs"][:3] == [None, -0.1, -0.2]
    assert "".join(e["choices"][0]["text"] for e in events) == "abcdef"


async def test_max_tokens_zero_without_echo_is_refused(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json=completion(max_tokens=0))
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "max_tokens"
