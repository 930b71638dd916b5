"""The autoscaler's reads: one shared session, every worker of a role scraped at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import aiohttp.web
import pytest

from frota.operator.scaling.autoscaler import read_all
from tests.loopback import serving


@pytest.fixture
async def workers() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """A /metrics server that counts how many scrapes it holds at once."""
    seen = {"in_flight": 0, "most": 0}
    release = asyncio.Event()

    async def metrics(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen["in_flight"] += 1
        seen["most"] = max(seen["most"], seen["in_flight"])
        if seen["in_flight"] == 3:
            release.set()
        await release.wait()
        seen["in_flight"] -= 1
        if request.match_info["n"] == "2":
            return aiohttp.web.Response(status=503)
        return aiohttp.web.Response(text="# TYPE up gauge\nup 1\n")

    app = aiohttp.web.Application()
    app.router.add_get("/{n}/metrics", metrics)
    async with serving(app) as base:
        yield base, seen


async def test_a_roles_workers_are_scraped_at_once_and_failures_dropped(workers) -> None:
    base, seen = workers
    urls = [f"{base}/{n}/metrics" for n in range(3)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        texts = await read_all(session, urls)
    assert seen["most"] == 3  # each scrape waited for the others: all three were in flight
    assert len(texts) == 2  # the one answering 503 gives no reading


async def test_an_unreachable_worker_gives_no_reading() -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        assert await read_all(session, ["http://127.0.0.1:9/metrics"]) == []
