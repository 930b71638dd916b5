"""The OpenAI surface of the worker app, against a fake engine."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer

from frota.server.app import ServerOptions, create_app
from tests.server.conftest import MODEL, bindings, start, wait_ready
from tests.server.fake_engine import FakeEngine


def completion(**kw: object) -> dict:
    return {"model": MODEL, "prompt": "abc", "max_tokens": 5, "temperature": 0, **kw}


def chat(**kw: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0, **kw}


async def sse(resp) -> list[dict | str]:  # type: ignore[no-untyped-def]
    events: list[dict | str] = []
    async for line in resp.content:
        line = line.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def test_completion_returns_text_and_usage(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json=completion())
    assert resp.status == 200
    body = await resp.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "defgh"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


async def test_streamed_completion_assembles_to_the_full_text(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json=completion(
        stream=True, stream_options={"include_usage": True}))
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = await sse(resp)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert text == "defgh"
    assert events[-3]["choices"][0]["finish_reason"] == "length"


async def test_one_write_per_engine_output_and_the_tail_in_the_closing_write(
        client: TestClient, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from aiohttp import web

    writes: list[bytes] = []
    closing: list[bytes] = []
    original_write, original_eof = web.StreamResponse.write, web.StreamResponse.write_eof

    async def write(self, data):  # type: ignore[no-untyped-def]
        writes.append(bytes(data))
        await original_write(self, data)

    async def write_eof(self, data=b""):  # type: ignore[no-untyped-def]
        if data:  # aiohttp ends every response with an empty write_eof as well
            closing.append(bytes(data))
        await original_eof(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", write)
    monkeypatch.setattr(web.StreamResponse, "write_eof", write_eof)
    events = await sse(await client.post("/v1/chat/completions", json=chat(
        max_tokens=5, stream=True, stream_options={"include_usage": True})))
    # The fake engine gives one token per output: the role chunk rides with the first
    # token, outputs 1-4 are one write each, and the last token, the usage chunk and
    # [DONE] leave together with the end of the response.
    assert len(writes) == 4
    assert writes[0].count(b"data: ") == 2 and b'"role":"assistant"' in writes[0]
    assert len(closing) == 1 and closing[0].count(b"data: ") == 3
    assert closing[0].endswith(b"data: [DONE]\n\n")
    body = await (await client.post("/v1/chat/completions", json=chat(max_tokens=5))).json()
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert streamed == body["choices"][0]["message"]["content"]
    assert events[-2]["usage"]["completion_tokens"] == 5


async def test_chat_completion_and_stream_agree(client: TestClient) -> None:
    body = await (await client.post("/v1/chat/completions", json=chat())).json()
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    events = await sse(await client.post("/v1/chat/completions", json=chat(stream=True)))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert streamed == message["content"]
    assert body["object"] == "chat.completion"
    assert events[1]["object"] == "chat.completion.chunk"


async def test_max_completion_tokens_overrides_max_tokens(client: TestClient) -> None:
    body = await (await client.post("/v1/chat/completions",
                                    json=chat(max_completion_tokens=2))).json()
    assert body["usage"]["completion_tokens"] == 2


async def test_n_choices_run_as_separate_engine_requests_with_seeds(
        client: TestClient, engine: FakeEngine) -> None:
    body = await (await client.post("/v1/completions", json=completion(
        n=3, seed=7, temperature=1.0))).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    ids = [r[0] for r in engine.requests]
    assert all(i.endswith(f"-{k}") for k, i in enumerate(ids))
    assert [r[2].seed for r in engine.requests] == [7, 8, 9]
    assert body["usage"]["prompt_tokens"] == 3
    assert body["usage"]["completion_tokens"] == 15


async def test_streamed_n_choices_each_finish(client: TestClient) -> None:
    events = await sse(await client.post("/v1/completions", json=completion(n=2, stream=True)))
    finished = {e["choices"][0]["index"] for e in events[:-1] if e["choices"][0]["finish_reason"]}
    assert finished == {0, 1}


async def test_seeded_requests_repeat(client: TestClient) -> None:
    a = await (await client.post("/v1/completions", json=completion(seed=3, temperature=1))).json()
    b = await (await client.post("/v1/completions", json=completion(seed=3, temperature=1))).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


async def test_stop_string_and_list_are_passed_to_the_engine(
        client: TestClient, engine: FakeEngine) -> None:
    body = await (await client.post("/v1/completions", json=completion(stop="f"))).json()
    assert body["choices"][0]["text"] == "de"
    assert body["choices"][0]["finish_reason"] == "stop"
    await client.post("/v1/completions", json=completion(stop=["x", "y"]))
    assert engine.requests[-1][2].stop == ["x", "y"]


async def test_extensions_reach_sampling_params(client: TestClient, engine: FakeEngine) -> None:
    await client.post("/v1/completions", json=completion(top_k=5, top_p=0.5, ignore_eos=True))
    params = engine.requests[-1][2]
    assert (params.top_k, params.top_p, params.ignore_eos) == (5, 0.5, True)
    await client.post("/v1/completions", json=completion(top_k=-1))
    assert engine.requests[-1][2].top_k is None


async def test_completion_logprobs(client: TestClient) -> None:
    body = await (await client.post("/v1/completions", json=completion(logprobs=2))).json()
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == list("defgh")
    assert lp["token_logprobs"][0] == -0.1
    assert len(lp["top_logprobs"]) == 5


async def test_chat_logprobs(client: TestClient) -> None:
    body = await (await client.post("/v1/chat/completions",
                                    json=chat(logprobs=True, top_logprobs=2))).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    assert content[0]["logprob"] == -0.1 and len(content[0]["top_logprobs"]) >= 2


async def test_token_id_prompts_and_batches(client: TestClient) -> None:
    body = await (await client.post("/v1/completions", json=completion(
        prompt=[[97], [98, 99]], n=2))).json()
    assert len(body["choices"]) == 4
    assert body["usage"]["prompt_tokens"] == 3


async def test_models_lists_the_served_name(client: TestClient) -> None:
    body = await (await client.get("/v1/models")).json()
    assert [m["id"] for m in body["data"]] == [MODEL]


async def test_health_ready_and_metrics(client: TestClient) -> None:
    assert (await client.get("/health")).status == 200
    assert (await client.get("/ready")).status == 200
    await client.post("/v1/completions", json=completion())
    text = await (await client.get("/metrics")).text()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket"):
        assert name in text, name
    assert 'vllm:cache_config_info{block_size="16",model_name="fake-model",' \
           'num_gpu_blocks="64"} 1.0' in text
    assert 'vllm:prompt_tokens_total{model_name="fake-model"} 3.0' in text
    assert 'vllm:generation_tokens_total{model_name="fake-model"} 5.0' in text


async def test_unknown_route_is_openai_shaped_404(client: TestClient) -> None:
    resp = await client.get("/v1/nothing")
    assert resp.status == 404
    assert "message" in (await resp.json())["error"]


async def test_unknown_model_is_404(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json=completion(model="gpt-9"))
    assert resp.status == 404
    error = (await resp.json())["error"]
    assert error["param"] == "model" and error["code"] == "model_not_found"


async def test_prompt_longer_than_context_is_400(client: TestClient, engine: FakeEngine) -> None:
    resp = await client.post("/v1/completions", json=completion(prompt="a" * engine.max_model_len))
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    resp = await client.post("/v1/completions", json=completion(max_tokens=engine.max_model_len))
    assert (await resp.json())["error"]["param"] == "max_tokens"


async def test_engine_invalid_request_error_becomes_400(client: TestClient,
                                                         engine: FakeEngine) -> None:
    for stream in (False, True):
        engine.reject_next = True
        resp = await client.post("/v1/completions", json=completion(stream=stream))
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["param"] == "prompt" and error["message"] == "rejected by the engine"


async def test_loading_worker_answers_503_and_health_200() -> None:
    release = asyncio.Event()
    engine = FakeEngine()

    async def slow_load():  # type: ignore[no-untyped-def]
        await release.wait()
        return bindings(engine)

    client = TestClient(TestServer(create_app(ServerOptions(MODEL), slow_load)))
    await client.start_server()
    try:
        assert (await client.get("/health")).status == 200
        assert (await client.get("/ready")).status == 503
        resp = await client.post("/v1/completions", json=completion())
        assert resp.status == 503
        assert resp.headers["Retry-After"]
        release.set()
        await wait_ready(client)
        assert [r[0] for r in engine.requests] == ["warmup"]
    finally:
        await client.close()


async def test_full_queue_answers_429_with_retry_after() -> None:
    engine = FakeEngine()
    engine.gate.clear()
    client = await start(engine, max_queue=2, warmup=False)
    try:
        held = [asyncio.create_task(client.post("/v1/completions", json=completion()))
                for _ in range(2)]
        async with asyncio.timeout(5):
            while len(engine.waiting) < 2:
                await asyncio.sleep(0.01)
        resp = await client.post("/v1/completions", json=completion())
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["type"] == "rate_limit_error"
        text = await (await client.get("/metrics")).text()
        assert 'vllm:num_requests_waiting{model_name="fake-model"} 2.0' in text
        engine.gate.set()
        assert [(await r).status for r in held] == [200, 200]
    finally:
        await client.close()


async def test_client_disconnect_mid_stream_aborts_the_engine_request() -> None:
    engine = FakeEngine(step_s=0.01)
    client = await start(engine, warmup=False)
    try:
        resp = await client.post("/v1/completions", json=completion(stream=True, max_tokens=400))
        await resp.content.readline()
        assert engine.running
        resp.close()
        async with asyncio.timeout(5):
            while engine.running or not engine.aborted:
                await asyncio.sleep(0.01)
        assert engine.requests[-1][0] in engine.aborted
        text = await (await client.get("/metrics")).text()
        assert 'vllm:kv_cache_usage_perc{model_name="fake-model"} 0.0' in text
    finally:
        await client.close()


async def test_one_structured_log_line_per_request(client: TestClient, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level("INFO", logger="frota.server.requests"):
        await client.post("/v1/completions", json=completion(n=2))
    records = [r for r in caplog.records if r.name == "frota.server.requests"]
    assert len(records) == 1
    fields = records[0].fields
    assert fields["status"] == "ok" and fields["n"] == 2
    assert fields["prompt_tokens"] == 3 and fields["generation_tokens"] == 10
    assert fields["ttft_s"] is not None and fields["total_s"] >= fields["ttft_s"]
    assert fields["finish_reason"] == ["length", "length"]
    from frota.server.logs import JsonFormatter
    assert json.loads(JsonFormatter().format(records[0]))["id"].startswith("cmpl-")
