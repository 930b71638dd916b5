"""Draining in-process (fake engine): 503 for new work, in-flight finish, then abort at the grace limit."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from frota.server.app import STATE_KEY, ServerOptions, create_app
from frota.server.lifecycle import Phase, serve
from tests.server.conftest import MODEL, bindings
from tests.server.fake_engine import FakeEngine
from tests.server.harness import free_port


async def _finish_reasons(resp: aiohttp.ClientResponse) -> list[str | None]:
    reasons = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            reasons.append(json.loads(line[6:])["choices"][0]["finish_reason"])
        elif line == "data: [DONE]":
            reasons.append("[DONE]")
    return reasons


async def test_stream_past_the_grace_period_is_aborted_and_serve_returns_zero() -> None:
    engine = FakeEngine(step_s=0.01)
    app = create_app(ServerOptions(MODEL, warmup=False), bindings(engine))
    state = app[STATE_KEY]
    port = free_port()
    server = asyncio.create_task(serve(app, state.lifecycle, "127.0.0.1", port, 0.3,
                                       state.abort_all))
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(10):
            while True:
                try:
                    if (await http.get(f"{url}/ready")).status == 200:
                        break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.01)
        body = {"model": MODEL, "prompt": "a", "max_tokens": 400, "stream": True}
        long = await http.post(f"{url}/v1/completions", json=body)
        assert long.status == 200
        short = await http.post(f"{url}/v1/completions",
                                json={**body, "max_tokens": 15, "temperature": 0})
        state.lifecycle.stopped.set()
        await asyncio.sleep(0.05)
        assert state.lifecycle.phase is Phase.DRAINING
        late = await http.post(f"{url}/v1/completions", json=body)
        assert late.status == 503
        assert (await late.json())["error"]["code"] == "service_unavailable"
        assert (await _finish_reasons(short))[-2:] == ["length", "[DONE]"]
        got = await _finish_reasons(long)
        assert got[-2:] == ["abort", "[DONE]"]
    assert await asyncio.wait_for(server, 15) == 0
    assert engine.is_shut_down
