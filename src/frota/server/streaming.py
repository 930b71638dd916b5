"""Server-sent events: `data: <json>` frames, closed by `data: [DONE]`.

Events are queued with `send` and go out with the next `flush`, several events in
one write: the generation loop flushes once per engine output, and the last
output's events, the usage chunk and `[DONE]` leave together with the end of the
response. Fewer writes mean fewer system calls on a CPU the engine shares.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies (nginx) must not buffer token streams
}
DONE = b"data: [DONE]\n\n"


def encode(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class EventStream:
    """One SSE response; headers go out with the first flush."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        self.started = False
        self._pending: list[bytes] = []

    async def start(self) -> EventStream:
        if not self.started:
            self.started = True
            await self.response.prepare(self.request)
        return self

    def send(self, obj: dict[str, Any]) -> None:
        """Queue one event; it reaches the client with the next `flush` (or `finish`)."""
        self._pending.append(encode(obj))

    async def flush(self) -> None:
        if self._pending:
            await self.response.write(self._take())

    async def finish(self, error: dict[str, Any] | None = None) -> web.StreamResponse:
        """End the stream in one write: queued events, an optional error event, `[DONE]`."""
        await self.start()
        if error is not None:
            self.send(error)
        self._pending.append(DONE)
        await self.response.write_eof(self._take())
        return self.response

    def _take(self) -> bytes:
        data = b"".join(self._pending)
        self._pending.clear()
        return data
