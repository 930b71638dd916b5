"""A real HTTP server on a free loopback port, for tests that scrape or call one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp.web


@contextlib.asynccontextmanager
async def serving(app: aiohttp.web.Application) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 and yield its base URL (http://127.0.0.1:PORT)."""
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
