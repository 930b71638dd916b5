"""`response_format` and `tools` against a real `frota worker` serving SmolLM2, through the
official `openai` client: outputs parse and validate, tool calls assemble, errors are 400s."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import jsonschema
import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings

from tests.json_schemas import OBJECT_SCHEMAS
from tests.server.harness import WorkerProcess

pytestmark = pytest.mark.slow
pytest.importorskip("xgrammar")
EXAMPLES = int(os.environ.get("FROTA_STRUCTURED_EXAMPLES", "8"))
MODEL = "smollm2"
ASK = [{"role": "user", "content": "Give me an example record as JSON."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
        "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
        "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def aoai(smollm2_worker: WorkerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{smollm2_worker.url}/v1", api_key="unused",
                              max_retries=0)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=OBJECT_SCHEMAS)
def test_generated_json_validates_against_its_schema(smollm2_worker: WorkerProcess, schema) -> None:  # type: ignore[no-untyped-def]
    async def one(client: openai.AsyncOpenAI, temperature: float):  # type: ignore[no-untyped-def]
        return await client.chat.completions.create(
            model=MODEL, messages=ASK, temperature=temperature, seed=5, max_tokens=256,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "record", "schema": schema, "strict": True}})

    async def both():  # type: ignore[no-untyped-def]
        # Concurrent, so the two share engine steps; a client per event loop.
        async with openai.AsyncOpenAI(base_url=f"{smollm2_worker.url}/v1", api_key="unused",
                                      max_retries=0) as client:
            return await asyncio.gather(one(client, 0.0), one(client, 1.0))

    for reply in asyncio.run(both()):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    country_code: str = pydantic.Field(pattern="^[A-Z]{2}$")
    population: int = pydantic.Field(ge=0, le=50_000_000)
    landmarks: list[Annotated[str, pydantic.Field(max_length=20)]] = pydantic.Field(max_length=3)


def test_parse_with_a_pydantic_model_returns_the_model(oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe Lisbon."}],
        response_format=City, temperature=0, max_tokens=200)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and city.name


def test_json_object_streamed_and_not_streamed_agree(oai: openai.OpenAI) -> None:
    body = dict(model=MODEL, messages=ASK, temperature=0, max_tokens=120,
                response_format={"type": "json_object"})
    full = oai.chat.completions.create(**body)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       oai.chat.completions.create(**body, stream=True) if c.choices)  # type: ignore[call-overload]
    assert streamed == full.choices[0].message.content
    if full.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(streamed), dict)


def _check_call(call, name: str | None = None) -> None:  # type: ignore[no-untyped-def]
    assert call.id.startswith("call_") and call.type == "function"
    assert name is None or call.function.name == name
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}],
                         ids=["required", "named"])
def test_forced_tool_call_follows_the_tool_schema(oai: openai.OpenAI, choice) -> None:  # type: ignore[no-untyped-def]
    reply = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=100)  # type: ignore[arg-type]
    out = reply.choices[0]
    assert out.finish_reason == "tool_calls"
    assert out.message.content is None
    assert len(out.message.tool_calls) == 1
    _check_call(out.message.tool_calls[0], None if choice == "required" else "add")


def test_streamed_tool_call_is_assembled_by_the_client(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(
            model=MODEL, messages=[{"role": "user", "content": "Weather in Rome, please."}],
            tools=TOOLS, tool_choice="required", temperature=0, max_tokens=100) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    [call] = final.choices[0].message.tool_calls
    _check_call(call)
    assert done and done[0].arguments == call.function.arguments


def test_tool_result_round_trip(oai: openai.OpenAI) -> None:
    first = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=100)
    call = first.choices[0].message.tool_calls[0]
    history = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 4, "sky": "snow"}'},
    ]
    answer = oai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER],
                                         temperature=0, max_tokens=40)
    out = answer.choices[0]
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the history is in the prompt
    assert out.finish_reason in {"stop", "length", "tool_calls"}
    for c in out.message.tool_calls or []:
        _check_call(c)
    assert out.message.tool_calls or out.message.content


def test_tool_choice_none_answers_in_text(oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS,
        tool_choice="none", temperature=0, max_tokens=16)
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content


def test_unknown_tool_and_bad_schemas_are_openai_shaped_400s(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                    tool_choice={"type": "function", "function": {"name": "nope"}})
    assert exc.value.body["param"] == "tool_choice" and "nope" in exc.value.body["message"]
    for schema, words in [
        ({"type": "array", "uniqueItems": True}, ["uniqueItems"]),
        ({"type": "object", "patternProperties": {"^a": {}}, "if": {}, "then": {}},
         ["patternProperties", "if", "then"]),
        ({"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}},
         ["properties.x.$ref"]),
        ({"type": "string", "pattern": "(("}, ["cannot be compiled", "parenthesis"]),
    ]:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as exc:
                oai.chat.completions.create(
                    model=MODEL, messages=ASK, stream=stream,  # type: ignore[call-overload]
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "x", "schema": schema}})
            assert exc.value.body["param"] == "response_format"
            assert exc.value.body["type"] == "invalid_request_error"
            assert all(w in exc.value.body["message"] for w in words), exc.value.body
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}}}
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=[bad_tool])
    assert exc.value.body["param"] == "tools" and "multipleOf" in exc.value.body["message"]


async def test_free_requests_are_unchanged_by_constrained_neighbours(
        aoai: openai.AsyncOpenAI) -> None:
    prompts = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(3)]

    async def free(messages):  # type: ignore[no-untyped-def]
        reply = await aoai.chat.completions.create(model=MODEL, messages=messages,
                                                   temperature=0, max_tokens=24)
        return reply.choices[0].message.content

    async def constrained(i: int):  # type: ignore[no-untyped-def]
        return await aoai.chat.completions.create(
            model=MODEL, messages=ASK, temperature=0.7, seed=i, max_tokens=120,
            response_format={"type": "json_object"})

    alone = [await free(m) for m in prompts]
    mixed = await asyncio.gather(*(free(m) for m in prompts), *(constrained(i) for i in range(3)))
    assert list(mixed[:3]) == alone
    for reply in mixed[3:]:
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(reply.choices[0].message.content), dict)
