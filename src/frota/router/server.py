"""The router's HTTP server: aiohttp's low-level server with the router's limits.

aiohttp (`aiohttp.web.Server`, no application or URL dispatcher) parses requests with
llhttp, keeps connections alive, answers the requests of one connection in order
(pipelined ones wait), closes connections idle for `keepalive_timeout` and ones that
start a request's head and stall (slowloris), and cancels a request's handler when
its client disconnects (`handler_cancellation`: the proxy then closes the upstream
connection, and the worker aborts the generation). What this module adds is the
router's contract on the wire:

- Bad input is answered in the OpenAI error shape and the connection closed:
  malformed requests 400, a request line and headers over `max_header_bytes` 431
  (aiohttp's parser also bounds each header line and their count, which bounds what
  it buffers), bodies over `max_body` 413, protocol upgrades 400. aiohttp's own
  answers to unparsable requests come from `RequestHandler.handle_error`, overridden.
- A handler that raises answers 500 and the connection stays usable.
- A request's body must arrive within `keepalive_timeout` too, else the connection
  is closed and nothing is served.
- `close` drains: every answer from then on says `Connection: close`, and a
  connection whose last answer did not is kept open until it has been idle for
  `idle_grace`, so a client that sent its next request before it could see the
  close is answered, not cut off (aiohttp's own shutdown closes after an answer that
  promised keep-alive, which breaks the client's next request).
- Handlers get a `Request` with the body read and return an aiohttp response.
- A relayed stream is a `ResponseStream`: aiohttp writes its head (with the first
  chunk) and its end; in between, `write` frames each chunk and hands it to the
  client's transport without waiting, in the upstream connection's own callback:
  awaiting aiohttp's `StreamResponse.write` per chunk instead costs a task wake-up
  per token (measured in docs/benchmarks.md, "Overhead"). When the client reads
  slower than the worker writes, flow control pauses the source (`set_flow_control`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from frota.router.errors import refusal

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
# One header line (name and value), and how many: what aiohttp's parser buffers
# before the whole head is checked against `max_header_bytes`.
MAX_FIELD_BYTES = 16 * 1024
MAX_HEADERS = 100
KEEPALIVE_TIMEOUT = 75.0
# While draining: how long a kept-alive connection may sit idle before it is closed.
DRAIN_IDLE_GRACE = 1.0
DRAIN_POLL_SECONDS = 0.05

# (status, message, OpenAI error code) for input the server refuses on its own.
Refusal = tuple[int, str, str]
BODY_TOO_LARGE: Refusal = (413, "request body too large", "request_too_large")
HEAD_TOO_LARGE: Refusal = (431, "request headers too large", "request_header_fields_too_large")
NO_UPGRADES: Refusal = (400, "protocol upgrades are not supported", "unsupported_upgrade")
INTERNAL: Refusal = (500, "internal router error", "internal_error")


class Request:
    """One request with its body read. `headers` is case-insensitive (a repeated
    header: its first value); `raw_headers` are the headers as sent."""

    __slots__ = ("body", "headers", "method", "path", "raw", "target")

    def __init__(self, raw: web.BaseRequest, body: bytes) -> None:
        self.raw = raw
        self.method = raw.method
        self.target = raw.raw_path  # path and query, as sent (ASCII: the parser checks)
        self.path = self.target.partition("?")[0]
        self.headers = raw.headers
        self.body = body

    @property
    def raw_headers(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw.raw_headers]

    @property
    def http_version(self) -> str:
        return f"{self.raw.version.major}.{self.raw.version.minor}"

    @property
    def client_gone(self) -> bool:
        transport = self.raw.transport
        return transport is None or transport.is_closing()


Handler = Callable[[Request], Awaitable[web.StreamResponse]]


class _Head(web.StreamResponse):
    # The head goes out with the first chunk in one write, as aiohttp's `Response`
    # does with its body.
    _send_headers_immediately = False


class ResponseStream:
    """A streamed answer (chunked; unframed to HTTP/1.0 clients, which are closed after):
    `open_stream` starts it, `write` sends a chunk without waiting, `end` ends it. The
    handler returns `response`. Writes after the client left are dropped (its task is
    being cancelled)."""

    __slots__ = ("_chunked", "_conn", "num_bytes", "response")

    def __init__(self, raw: web.BaseRequest, response: web.StreamResponse,
                 chunked: bool) -> None:
        self.response = response
        self._conn: _Connection = raw.protocol  # type: ignore[assignment]
        self._chunked = chunked
        self.num_bytes = 0

    def write(self, data: bytes) -> None:
        transport = self._conn.raw_transport
        if not data or transport is None or transport.is_closing():
            return
        self.num_bytes += len(data)
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)

    def set_flow_control(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        """Call `pause` when the client's send buffer fills up, `resume` when it drains."""
        self._conn.flow = (pause, resume)
        if self._conn.writing_paused:
            pause()

    async def end(self) -> None:
        self._conn.flow = None
        await self.response.write_eof()


async def open_stream(request: Request, status: int, headers: Iterable[tuple[str, str]],
                      first: bytes) -> ResponseStream:
    """Start a streamed answer with its first chunk."""
    raw = request.raw
    response = _Head(status=status, headers=list(headers))
    chunked = raw.version >= HttpVersion11
    if chunked:  # said outright: `ResponseStream.write` frames what follows the same way
        response.enable_chunked_encoding()
    await response.prepare(raw)
    await response.write(first)
    stream = ResponseStream(raw, response, chunked)
    stream.num_bytes = len(first)
    return stream


def _hang_up(raw: web.BaseRequest) -> web.StreamResponse:
    """Close the connection without an answer (aiohttp finds it closed and drops the
    response returned here)."""
    raw.protocol.force_close()
    return web.Response()


def _refuse(refused: Refusal) -> web.Response:
    """A refusal, after which the connection closes. The header says so because aiohttp
    leaves it out for HTTP/1.0, and it answers an unparsable request as HTTP/1.0."""
    response = refusal(*refused)
    response.headers["Connection"] = "close"
    response.force_close()
    return response


class _Connection(RequestHandler):
    """aiohttp's connection protocol; unparsable requests are refused in the OpenAI
    shape, a stream being written hears of the client's flow control, and the server
    keeps track of the transports to drain them on close."""

    def __init__(self, owner: HttpServer, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.owner = owner
        self.raw_transport: asyncio.Transport | None = None
        # A stream's (pause, resume) for its source, while one is being written.
        self.flow: tuple[Callable[[], None], Callable[[], None]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.raw_transport = transport  # type: ignore[assignment]
        self.owner.connections.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.owner.connections.discard(self)
        self.flow = None
        super().connection_lost(exc)

    @property
    def busy(self) -> bool:
        """A request is being read, answered or queued, or an answer is still being
        flushed."""
        transport = self.raw_transport
        return bool(self._request_in_progress or self._messages or (
            transport is not None and transport.get_write_buffer_size()))

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.flow is not None:
            self.flow[0]()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.flow is not None:
            self.flow[1]()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # Clients send garbage now and then: not an error of the router's.
        log.debug("refused a request from %s: %s", request.remote, message or exc)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer is under way: no room for an error")
        if isinstance(exc, LineTooLong) or (
                isinstance(exc, BadHttpMessage) and "Too many headers" in exc.message):
            return _refuse(HEAD_TOO_LARGE)
        if status == 400:  # llhttp's reason, without the excerpt it draws under it
            reason = ((message or "").strip().splitlines() or ["unparsable"])[0]
            reason = reason.rstrip(":")[:200]
            return _refuse((400, f"malformed HTTP request ({reason})", "bad_request"))
        return _refuse(INTERNAL)


class _WebServer(web.Server):
    """aiohttp's low-level server, making `_Connection`s."""

    def __init__(self, owner: HttpServer, handler: Callable[[web.BaseRequest],
                 Awaitable[web.StreamResponse]], **kwargs: Any) -> None:
        super().__init__(handler, handler_cancellation=True, **kwargs)
        self.owner = owner

    def __call__(self) -> RequestHandler:
        return _Connection(self.owner, self, loop=self._loop, **self._kwargs)

    def _make_request(self, message: Any, payload: Any, protocol: RequestHandler,
                      writer: Any, task: asyncio.Task[None]) -> web.BaseRequest:
        return _RawRequest(message, payload, protocol, writer, task, self._loop)


class _RawRequest(web.BaseRequest):
    """aiohttp's request; while the server drains, its answer asks the client to close."""

    @property
    def keep_alive(self) -> bool:  # read once, when the answer's head is written
        owner: HttpServer = self.protocol.owner  # type: ignore[union-attr]
        return not owner.draining and not self._message.should_close


class HttpServer:
    """Listens and serves `handler` (see the module docstring for what it refuses)."""

    def __init__(self, handler: Handler, *, max_body: int = MAX_BODY,
                 max_header_bytes: int = MAX_HEADER_BYTES,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT) -> None:
        self.handler = handler
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.keepalive_timeout = keepalive_timeout
        self.connections: set[_Connection] = set()
        self.draining = False
        self._tasks: set[asyncio.Task[Any]] = set()  # handlers running
        self._web: _WebServer | None = None
        self._server: asyncio.AbstractServer | None = None

    async def listen(self, host: str, port: int, *, backlog: int = 2048) -> int:
        """Start listening; returns the port (useful with port 0)."""
        line = min(MAX_FIELD_BYTES, self.max_header_bytes)
        self._web = _WebServer(
            self, self._serve, keepalive_timeout=self.keepalive_timeout,
            max_line_size=line, max_field_size=line, max_headers=MAX_HEADERS,
            # Bodies pass through as sent; a refused body is not waited for.
            auto_decompress=False, lingering_time=0, access_log=None)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._web, host, port, backlog=backlog,
                                                reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    async def close(self, grace: float = 5.0, idle_grace: float = DRAIN_IDLE_GRACE) -> None:
        """Stop accepting and drain: requests in flight get `grace` seconds, and every
        answer from now on says `Connection: close`. A connection is closed once it has
        been idle for `idle_grace`; what is left at `grace` is cut off."""
        if self._server is None or self._web is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        self.draining = True
        self._server.close()
        idle_since: dict[_Connection, float] = {}
        while self.connections and loop.time() < deadline:
            now = loop.time()
            for conn in list(self.connections):
                if conn.busy:
                    idle_since.pop(conn, None)
                elif now - idle_since.setdefault(conn, now) >= idle_grace:
                    conn.force_close()
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        cut = [conn for conn in self.connections if conn.raw_transport is not None]
        if cut:
            busy = sum(conn.busy for conn in cut)
            log.warning("drain: %.0f s grace over, cutting %d connection(s), %d with a "
                        "request in flight", grace, len(cut), busy)
        for conn in cut:
            conn.raw_transport.abort()
        if self._tasks:  # cancelled by their connections' loss
            await asyncio.wait(list(self._tasks), timeout=1.0)
        self._server = self._web = None

    # -- one request
    async def _serve(self, raw: web.BaseRequest) -> web.StreamResponse:
        headers = raw.headers
        if raw.method == "CONNECT" or (
                "upgrade" in headers and "upgrade" in headers.get("connection", "").lower()):
            return _refuse(NO_UPGRADES)
        head_bytes = len(raw.raw_path) + sum(len(k) + len(v) for k, v in raw.raw_headers)
        if head_bytes > self.max_header_bytes:
            return _refuse(HEAD_TOO_LARGE)
        length = raw.content_length
        if length is not None and length > self.max_body:
            return _refuse(BODY_TOO_LARGE)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            body = b""
            if raw.body_exists:
                if headers.get("expect", "").lower() == "100-continue":
                    await raw.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                try:
                    body = await self._read_body(raw)
                except TimeoutError:  # the body stalled: treated like a stalled head
                    return _hang_up(raw)
                except RequestPayloadError as exc:  # e.g. broken chunked framing
                    return _refuse((400, f"malformed HTTP request ({exc})", "bad_request"))
                if body is None:
                    return _refuse(BODY_TOO_LARGE)
            request = Request(raw, body)
            try:
                return await self.handler(request)
            except Exception:
                if request.client_gone:
                    return _hang_up(raw)
                log.exception("unhandled error serving %s %s", raw.method, request.target)
                if raw.writer.output_size > 0:  # a stream broke off: end it by closing
                    return _hang_up(raw)
                return refusal(*INTERNAL)
        finally:
            self._tasks.discard(task)
            raw.protocol.flow = None  # type: ignore[attr-defined]

    async def _read_body(self, raw: web.BaseRequest) -> bytes | None:
        """The whole body; None when it is over `max_body`."""
        content = raw.content
        parts: list[bytes] = []
        size = 0
        # A body already received whole is read without a timer.
        async with asyncio.timeout(None if content.is_eof() else self.keepalive_timeout):
            while chunk := await content.readany():
                size += len(chunk)
                if size > self.max_body:
                    return None
                parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
