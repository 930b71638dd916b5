"""Server-sent events: `data: <json>` frames, closed by `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies (nginx) must not buffer token streams
}


def encode(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class EventStream:
    """One SSE response; headers go out on the first `send`."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        self.started = False

    async def start(self) -> EventStream:
        if not self.started:
            self.started = True
            await self.response.prepare(self.request)
        return self

    async def send(self, obj: dict[str, Any]) -> None:
        await self.response.write(encode(obj))

    async def finish(self, error: dict[str, Any] | None = None) -> web.StreamResponse:
        """End the stream: an optional error event, then `[DONE]`."""
        await self.start()
        if error is not None:
            await self.response.write(encode(error))
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()
        return self.response
