"""The router's HTTP/1.1 server: requests in, whole or streamed responses out, little work per byte.

The router relays streams: each token a worker sends is one chunk in and one chunk
out. Under aiohttp's server and client every chunk cost a parser pass, a reader
buffer, a future, a task wake-up and an awaited write, and the router spent
~1.5 ms of CPU per 32-token request. Here a relayed chunk is one `data_received`
on the upstream connection and one `transport.write` to the client
(`frota.router.upstream` feeds a `ResponseStream` directly), and the whole request
path is a few parser callbacks and one task.

- Requests are parsed by httptools (llhttp, Node.js's parser). Each gets one task
  running the handler; the requests of one connection are answered in order
  (pipelined ones wait, with reading paused).
- A handler returns a `Response` (whole body, `Content-Length`) or a
  `ResponseStream` it has written (chunked). `ResponseStream.write` does not wait:
  it hands the bytes to the transport, and when the client reads slower than the
  source writes, flow control pauses the source (`ResponseStream.set_flow_control`) instead.
- Keep-alive per HTTP/1.1; `Connection: close` and HTTP/1.0 close after the response.
  A connection has `keepalive_timeout` to send its next request whole: idle ones, and
  ones that start a request and stall (slowloris), are closed.
- A client that disconnects cancels its request's task (the proxy then closes the
  upstream connection, and the worker aborts the generation).
- Bad input answers in the OpenAI error shape and closes the connection: malformed
  requests 400, headers over `max_header_bytes` 431, bodies over `max_body` 413,
  protocol upgrades 400. A handler that raises answers 500; the server goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from typing import Any

import httptools

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
KEEPALIVE_TIMEOUT = 75.0
# Bytes queued for a slow client before its stream's source is paused.
WRITE_HIGH_WATER = 256 * 1024

HeaderList = list[tuple[str, str]]
Headers = dict[str, str]  # lower-case names; repeated headers joined with ", "


_REASONS = {s.value: s.phrase for s in HTTPStatus}

# (status, message, OpenAI error code) for input the server refuses on its own.
Refusal = tuple[int, str, str]
BODY_TOO_LARGE: Refusal = (413, "request body too large", "request_too_large")
HEAD_TOO_LARGE: Refusal = (431, "request headers too large", "request_header_fields_too_large")
NO_UPGRADES: Refusal = (400, "protocol upgrades are not supported", "unsupported_upgrade")


class Request:
    """One parsed request. `headers` has lower-case names; `raw_headers` keeps them as sent."""

    __slots__ = (
        "_conn",
        "body",
        "headers",
        "http_version",
        "keep_alive",
        "method",
        "path",
        "query",
        "raw_headers",
        "target",
    )

    def __init__(self, conn: _Connection, method: str, target: str,
                 raw_headers: HeaderList, body: bytes, http_version: str,
                 keep_alive: bool) -> None:
        self._conn = conn
        self.method = method
        self.target = target  # path and query, as sent
        path, _, self.query = target.partition("?")
        self.path = path
        self.raw_headers = raw_headers
        headers: Headers = {}
        for name, value in raw_headers:
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.headers = headers
        self.body = body
        self.http_version = http_version
        self.keep_alive = keep_alive

    @property
    def client_gone(self) -> bool:
        return self._conn.closed


class Response:
    """A whole response: status, body and headers (`Content-Length` is added)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int = 200, body: bytes = b"",
                 headers: Iterable[tuple[str, str]] | dict[str, str] = (),
                 content_type: str | None = None) -> None:
        self.status = status
        self.body = body
        items = list(headers.items()) if isinstance(headers, dict) else list(headers)
        if content_type is not None:
            items.append(("Content-Type", content_type))
        self.headers: HeaderList = items


def json_response(payload: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload).encode(), headers or (),
                    content_type="application/json; charset=utf-8")


class ResponseStream:
    """A streamed (chunked) response. `start` sends the head with the first chunk in one
    write; `write` frames and hands bytes to the transport without waiting; `end` ends it.
    Writes after the client left are dropped (its task is being cancelled)."""

    __slots__ = ("_chunked", "_conn", "_head", "ended", "num_bytes", "status")

    def __init__(self, request: Request, status: int, headers: Iterable[tuple[str, str]]) -> None:
        self.status = status
        self._conn = request._conn
        # HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
        self._chunked = request.http_version != "1.0"
        if self._chunked:
            headers = [*headers, ("Transfer-Encoding", "chunked")]
        else:
            request.keep_alive = False
            headers = [*headers, ("Connection", "close")]
        self._head: bytes | None = _encode_head(status, headers)
        self.ended = False
        self.num_bytes = 0

    def set_flow_control(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        """Called when the client's send buffer fills up / drains: pause the source."""
        self._conn.flow = (pause, resume)
        if self._conn.paused:
            pause()

    def start(self, first: bytes = b"") -> None:
        head, self._head = self._head, None
        assert head is not None, "start() called twice"
        self._send(head + self._frame(first) if first else head)

    def write(self, data: bytes) -> None:
        if data:
            self._send(self._frame(data))

    def end(self) -> None:
        if self.ended:
            return
        if self._head is not None:
            self.start()
        self.ended = True
        self._conn.flow = None
        if self._chunked:
            self._send(b"0\r\n\r\n")

    def _frame(self, data: bytes) -> bytes:
        self.num_bytes += len(data)
        return b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data

    def _send(self, data: bytes) -> None:
        if not self._conn.closed:
            self._conn.transport.write(data)


Handler = Callable[[Request], Awaitable[Response | ResponseStream]]
ErrorFactory = Callable[[int, str, str], Response]


def _encode_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    reason = _REASONS.get(status, "Unknown")
    lines = [f"HTTP/1.1 {status} {reason}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


class _Connection(asyncio.Protocol):
    """One client connection: parses requests and answers them in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.paused = False  # the client's send buffer is over the high-water mark
        self.flow: tuple[Callable[[], None], Callable[[], None]] | None = None
        self.task: asyncio.Task[None] | None = None
        self.pipeline: deque[Request] = deque()
        self.idle_timer: asyncio.TimerHandle | None = None
        self.reject: Refusal | None = None
        self._url = b""
        self._headers: HeaderList = []
        self._header_bytes = 0
        self._in_head = False  # between the first byte of a request and its blank line
        self._body: list[bytes] = []
        self._body_size = 0

    # -- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.server.connections.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
            if self._in_head:  # llhttp hands a header over only once complete: bound it here
                self._count_head_bytes(len(data))
        except httptools.HttpParserUpgrade:
            self.reject = NO_UPGRADES
        except httptools.HttpParserError as exc:
            if self.reject is None:
                reason = str(exc).split(":", 1)[-1].strip() or "unparsable"
                self.reject = (400, f"malformed HTTP request ({reason})", "bad_request")
        if self.reject is not None:
            self._answer_and_close(*self.reject)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        if self.task is not None:
            self.task.cancel()  # the client left: stop serving it (closes the upstream)
        self.pipeline.clear()

    def pause_writing(self) -> None:
        self.paused = True
        if self.flow is not None:
            self.flow[0]()

    def resume_writing(self) -> None:
        self.paused = False
        if self.flow is not None:
            self.flow[1]()

    # -- parser callbacks
    def on_message_begin(self) -> None:
        # The keep-alive timer keeps running until the request is whole: a client that
        # starts a request and goes quiet is closed like an idle one.
        self._in_head = True
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._body = []
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head_bytes(len(url))  # the request line counts toward the limit too

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._count_head_bytes(len(name) + len(value)):
            return
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def _count_head_bytes(self, num_bytes: int) -> bool:
        self._header_bytes += num_bytes
        if self._header_bytes > self.server.max_header_bytes:
            self.reject = self.reject or HEAD_TOO_LARGE
            return False
        return True

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self.reject is not None:
            return
        if self.parser.should_upgrade():  # llhttp completes the message before it says so
            self.reject = NO_UPGRADES
            return
        for name, value in self._headers:
            lower = name.lower()
            if lower == "content-length" and value.isdigit() \
                    and int(value) > self.server.max_body:
                self.reject = BODY_TOO_LARGE
                return
            if lower == "expect" and value.lower() == "100-continue":
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.reject is not None:
            return
        self._body_size += len(body)
        if self._body_size > self.server.max_body:
            self.reject = BODY_TOO_LARGE
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self.reject is not None:
            return
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        parser = self.parser
        request = Request(self, parser.get_method().decode("latin-1"),
                          self._url.decode("latin-1"), self._headers, b"".join(self._body),
                          parser.get_http_version(), parser.should_keep_alive())
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve(request))
        else:  # pipelined behind a request still being answered
            self.pipeline.append(request)
            self.transport.pause_reading()

    # -- answering
    async def _serve(self, request: Request) -> None:
        while True:
            try:
                response = await self.server.handler(request)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("unhandled error serving %s %s", request.method, request.target)
                response = self.server.error(500, "internal router error", "internal_error")
            if self.closed:
                return
            if isinstance(response, ResponseStream):
                response.end()  # no-op when the handler ended it; starts it when never started
            else:
                self._write_response(response, request.keep_alive)
            if not request.keep_alive or self.reject is not None:
                self.transport.close()
                return
            if not self.pipeline:
                self.task = None
                self._arm_idle_timer()
                return
            request = self.pipeline.popleft()
            if not self.pipeline:
                self.transport.resume_reading()

    def _write_response(self, response: Response, keep_alive: bool) -> None:
        headers = response.headers
        headers.append(("Content-Length", str(len(response.body))))
        if not keep_alive:
            headers.append(("Connection", "close"))
        self.transport.write(_encode_head(response.status, headers) + response.body)

    def _answer_and_close(self, status: int, message: str, code: str) -> None:
        """Bad input on the connection: answer (when no answer is in progress) and close."""
        if self.closed:
            return
        if self.task is None:
            self._write_response(self.server.error(status, message, code), keep_alive=False)
            self.transport.close()
        else:  # a response is being written: do not interleave; just stop reading
            self.transport.pause_reading()
            self.pipeline.clear()

    def _arm_idle_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self.idle_timer = loop.call_later(self.server.keepalive_timeout, self._idle_close)

    def _idle_close(self) -> None:
        self.idle_timer = None
        if self.task is None and not self.closed:
            self.transport.close()


class HttpServer:
    """Listens and serves `handler`; `error(status, message, code)` builds error answers."""

    def __init__(self, handler: Handler, error: ErrorFactory, *, max_body: int = MAX_BODY,
                 max_header_bytes: int = MAX_HEADER_BYTES,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT) -> None:
        self.handler = handler
        self.error = error
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.keepalive_timeout = keepalive_timeout
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def listen(self, host: str, port: int, *, backlog: int = 2048) -> int:
        """Start listening; returns the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=backlog, reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    async def close(self, grace: float = 5.0) -> None:
        """Stop accepting; give requests in flight `grace` seconds, then cut them off."""
        if self._server is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        self._server.close()
        for conn in list(self.connections):
            if conn.task is None:
                conn.transport.close()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        # Answers written but not yet flushed to slow clients get the rest of the grace.
        while loop.time() < deadline and any(
                c.task is None and c.transport.get_write_buffer_size()
                for c in self.connections):
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if conn.task is not None:
                conn.task.cancel()
            conn.transport.abort()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None
