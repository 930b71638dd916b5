"""Fixtures: the worker app around a fake engine, and a real `frota worker` process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from frota.server.app import ServerOptions, create_app
from frota.server.engine_api import EngineBindings

from tests.server.fake_engine import FakeEngine, FakeInvalidRequestError, FakeSamplingParams

MODEL = "fake-model"


def bindings(engine: FakeEngine) -> EngineBindings:
    return EngineBindings(engine, FakeSamplingParams, FakeInvalidRequestError)


async def wait_ready(client: TestClient, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while (await client.get("/ready")).status != 200:
            await asyncio.sleep(0.01)


async def start(engine: FakeEngine, **options: object) -> TestClient:
    app = create_app(ServerOptions(MODEL, **options), bindings(engine))  # type: ignore[arg-type]
    client = TestClient(TestServer(app, handler_cancellation=True))
    await client.start_server()
    await wait_ready(client)
    return client


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def client(engine: FakeEngine) -> AsyncIterator[TestClient]:
    c = await start(engine, warmup=False)
    yield c
    await c.close()
