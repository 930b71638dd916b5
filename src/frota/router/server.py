"""The router's HTTP server: HTTP/1.1 on an asyncio protocol and httptools' parser (llhttp).

Hand-written on public APIs (`asyncio.Protocol`, `httptools.HttpRequestParser`) because
it costs less CPU than aiohttp's low-level server for what the router does: measured by
`bench/router.py --overhead`, 0.94 against 1.33 ms per request at 64 streams and 0.70
against 0.86 ms at 256 (docs/benchmarks.md, "Overhead"). A connection parses what it
receives as it arrives (a head that arrives whole, the usual case, without a Python call
per header: `_Connection._feed`) and answers its requests one at a time, in order:
pipelined ones wait. It keeps connections alive, closes one idle for
`keepalive_timeout`, and closes one whose request (head or body) has not fully arrived
`keepalive_timeout` after it began (slowloris), without serving it. When a client
disconnects, its request's handler is cancelled (the proxy then closes the upstream
connection, and the worker aborts the generation).

What one client can make the server hold is bounded ("Connection limits and buffers" in
docs/router.md):

- Unsent bytes: each transport pauses writing above WRITE_BUFFER_HIGH. While it is
  paused the connection reads nothing, a stream's source is paused, and the next
  pipelined request waits until the client has taken its answers; so a connection holds
  at most WRITE_BUFFER_HIGH and one answer unsent (besides the kernel's socket buffers).
  A client that takes nothing for `write_timeout` (writing stays paused, or a closing
  connection's last bytes stay unsent) has its connection aborted: a stalled reader
  never holds a connection, its handler or its worker for good.
- Requests received ahead of their turn: a connection stops reading while MAX_PIPELINED
  requests, or more than MAX_PIPELINED_BODY_BYTES of their bodies, wait.
- Connections: at most `max_connections` per server. One past it is answered a 503 in
  the OpenAI error shape, with `Retry-After`, before anything it sends is read, and
  closed; what it sends is discarded (so that its close is not a reset, which could
  destroy the 503 unread) for at most TURN_AWAY_LINGER seconds, at most
  MAX_TURNED_AWAY connections at once (beyond them: reset at once).

The router's contract on the wire:

- Bad input is answered in the OpenAI error shape and the connection closed: malformed
  requests 400 (llhttp's reason; HTTP/1.1 without Host too), a request line and headers
  over `max_header_bytes` or more than MAX_HEADERS headers 431 (counted as they arrive,
  so an endless header is cut off at the limit), bodies over `max_body` 413 (before the
  body when its length says so), protocol upgrades and CONNECT 400.
- `Expect: 100-continue` is answered when the request's turn comes, before its body is
  waited for.
- A handler that raises answers 500 and the connection stays usable; one that raises
  mid-stream has its connection closed (the client sees the stream cut off).
- HTTP/1.0 is answered as such: closed after the answer unless it asked for keep-alive,
  and a stream is sent unframed and ended by the close.
- `close` drains: every answer from then on says `Connection: close`, and a connection
  whose last answer did not is kept open until it has been idle for `idle_grace`, so a
  client that sent its next request before it could see the close is answered, not cut
  off.
- Handlers get a `Request` with the body read and return a `Response`, or the
  `ResponseStream` they opened with `open_stream`: its head goes out with the first
  chunk, `write` frames each chunk and hands it to the client's transport without
  waiting, in the upstream connection's own callback (awaiting a writer per chunk costs
  a task wake-up per token), and `end` ends it. When the client reads slower than the
  worker writes, flow control pauses the source (`set_flow_control`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import httptools

if TYPE_CHECKING:
    from frota.router.loop_metrics import HistogramValue

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 100
KEEPALIVE_TIMEOUT = 75.0
# Requests of one connection parsed and waiting for their turn before it stops reading,
# and the most bytes of their bodies it holds before it stops reading (when more than
# one request is held: the one being answered is always read whole).
MAX_PIPELINED = 16
MAX_PIPELINED_BODY_BYTES = 1024 * 1024
# Unsent bytes a connection's transport holds before it pauses writing, and below which
# it resumes (asyncio's and uvloop's defaults, set explicitly so that both loops bound
# a connection alike). A paused connection reads nothing until the client catches up.
WRITE_BUFFER_HIGH = 64 * 1024
WRITE_BUFFER_LOW = 16 * 1024
# How long a client may take nothing of its answers (WRITE_BUFFER_HIGH - _LOW bytes)
# before its connection is aborted; nginx's send_timeout.
WRITE_TIMEOUT = 60.0
# Connections one server holds at once. A connection idle costs the router about 3.4 KiB
# of memory and one file descriptor (docs/router.md, "Connection limits and buffers").
MAX_CONNECTIONS = 4096
# A connection over `max_connections`: how long its client may take to read the 503 and
# close, and how many may do so at once.
TURN_AWAY_LINGER = 2.0
MAX_TURNED_AWAY = 256
RETRY_AFTER_S = 1
# File descriptors a server leaves for everything but its clients' connections (the
# workers', the listening sockets, logs); see `HttpServer.listen`.
NUM_OTHER_FDS = 1024
# While draining: how long a kept-alive connection may sit idle before it is closed.
DRAIN_IDLE_GRACE = 1.0
DRAIN_POLL_SECONDS = 0.05

# (status, message, OpenAI error code) for input the server refuses on its own.
Refusal = tuple[int, str, str]
BODY_TOO_LARGE: Refusal = (413, "request body too large", "request_too_large")
HEAD_TOO_LARGE: Refusal = (431, "request headers too large", "request_header_fields_too_large")
NO_UPGRADES: Refusal = (400, "protocol upgrades are not supported", "unsupported_upgrade")
NO_HOST: Refusal = (400, "malformed HTTP request (HTTP/1.1 without a Host header)",
                    "bad_request")
INTERNAL: Refusal = (500, "internal router error", "internal_error")
TOO_MANY_CONNECTIONS = (f"the router holds as many connections as it may; retry after "
                        f"{RETRY_AFTER_S}s")

_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n" for s in HTTPStatus}
_CHUNKED = ("Transfer-Encoding", "chunked")


class Headers(Mapping[str, str]):
    """A request's headers by case-insensitive name (a repeated header: its first value).
    `lines` holds them as sent (`"Name: value"`), `names` their names in lower case, in the
    same order, and `first` each name's first line; a value is read out of its line when
    it is asked for."""

    __slots__ = ("first", "lines", "names")

    def __init__(self, block: bytes) -> None:
        """From a head's header lines, `block` (CRLF between lines, none around them),
        in one pass: one decode, one split, no call per header."""
        self.lines = lines = block.decode("latin-1").split("\r\n") if block else []
        self.names = names = [line.partition(":")[0].lower() for line in lines]
        # Filled last to first, so that the first line of a name stays.
        self.first = dict(zip(reversed(names), reversed(lines), strict=True))

    def __getitem__(self, name: str) -> str:
        return _value(self.first[name.lower()])

    def get(self, name: str, default: Any = None) -> Any:
        line = self.first.get(name.lower())
        return default if line is None else _value(line)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self.first

    def __iter__(self) -> Iterator[str]:
        return iter(self.first)

    def __len__(self) -> int:
        return len(self.first)

    @property
    def raw(self) -> list[tuple[str, str]]:
        """(name, value) pairs as sent."""
        return [(name, value.strip()) for name, _, value in
                (line.partition(":") for line in self.lines)]

    def getall(self, name: str) -> list[str]:
        name = name.lower()
        return [_value(line) for n, line in zip(self.names, self.lines, strict=True) if n == name]


def _value(line: str) -> str:
    """The value of a header line."""
    return line.partition(":")[2].strip()


def _declared_length(head: Headers) -> int | None:
    """The body's length its Content-Length declares (0 without one); None when that is
    not plain ASCII digits (`int()` would take "+2", "1_0" and other digits)."""
    declared = head.first.get("content-length")
    if declared is None:
        return 0
    digits = _value(declared)
    return int(digits) if digits.isascii() and digits.isdigit() else None


class Request:
    """One request with its body read. `headers` is case-insensitive; `raw_headers` are
    the headers as sent."""

    __slots__ = ("_conn", "body", "headers", "http_version", "method", "path", "target")

    def __init__(self, conn: _Connection, message: _Message) -> None:
        self._conn = conn
        self.method = message.method
        self.target = message.target  # path and query, as sent (ASCII: the parser checks)
        self.path = self.target.partition("?")[0]
        self.headers = message.headers
        self.http_version = message.version
        self.body = message.body()

    @property
    def raw_headers(self) -> list[tuple[str, str]]:
        return self.headers.raw

    @property
    def client_gone(self) -> bool:
        transport = self._conn.transport
        return transport is None or transport.is_closing()


class Response:
    """A whole answer. `headers` must leave out Content-Length, Transfer-Encoding and
    Connection: the server writes those."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int = 200, body: bytes = b"",
                 headers: Iterable[tuple[str, str]] | Mapping[str, str] = ()) -> None:
        self.status = status
        self.body = body
        # A list first: `isinstance` against the `Mapping` ABC is a Python-level call.
        self.headers: list[tuple[str, str]] = list(
            headers if isinstance(headers, list) else
            headers.items() if isinstance(headers, Mapping) else headers)

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for n, v in self.headers if n.lower() == name), None)


class ResponseStream:
    """A streamed answer (chunked; unframed to HTTP/1.0 clients, which are closed after):
    `open_stream` starts it, `write` sends a chunk without waiting, `end` ends it. The
    handler returns it. Writes after the client left are dropped (its task is being
    cancelled)."""

    __slots__ = ("_conn", "_gaps", "_last_write", "chunked", "ended", "status")

    def __init__(self, conn: _Connection, status: int, chunked: bool) -> None:
        self._conn = conn
        self.status = status
        self.chunked = chunked
        self.ended = False
        self._gaps: HistogramValue | None = None
        self._last_write = 0.0

    def time_gaps(self, histogram: HistogramValue | None) -> None:
        """From now on observe the seconds between one write and the next (from now to
        the first) in `histogram` (None: no more): inter-token latency, timed where each
        chunk goes out, so that relaying a chunk costs no call more than the write."""
        self._gaps = histogram
        self._last_write = time.perf_counter()

    def write(self, data: bytes) -> None:
        """Send `data` as one chunk (as it is, to an HTTP/1.0 client)."""
        if data:
            self.write_raw(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)

    def write_raw(self, data: bytes) -> None:
        """Send bytes already framed as the stream needs them: whole chunks, as a worker's
        chunked body arrives (`frota.router.upstream`). Once per relayed chunk."""
        transport = self._conn.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        gaps = self._gaps
        if gaps is not None:  # HistogramValue.observe, inlined: once per token, the call
            # would cost 12k more instructions per 32-token stream (callgrind)
            now = time.perf_counter()
            gap = now - self._last_write
            gaps.counts[bisect_left(gaps.bounds, gap)] += 1
            gaps.sum += gap
            self._last_write = now

    def set_flow_control(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        """Call `pause` when the client's send buffer fills up, `resume` when it drains."""
        self._conn.flow = (pause, resume)
        if self._conn.writing_paused:
            pause()

    def end(self, *, ended_raw: bool = False) -> None:
        """End the stream; `ended_raw`: the end of the body went through `write_raw`
        already."""
        if self.ended:
            return
        self.ended = True
        self._conn.flow = None
        transport = self._conn.transport
        if (self.chunked and not ended_raw and transport is not None
                and not transport.is_closing()):
            transport.write(b"0\r\n\r\n")

    def cut(self) -> None:
        """End the stream by closing the connection, when it cannot be ended cleanly (a
        chunk that went out raw broke off): the client sees it cut off."""
        self.ended = True
        self._conn.flow = None
        self._conn._close()


Answer = Response | ResponseStream
Handler = Callable[[Request], Awaitable[Answer]]


def open_stream(request: Request, status: int, headers: Iterable[tuple[str, str]],
                first: bytes) -> ResponseStream:
    """Start a streamed answer with its first chunk (head and chunk in one write)."""
    conn = request._conn
    message = conn.queue[0]
    chunked = message.version != "1.0"
    stream = ResponseStream(conn, status, chunked)
    conn.stream = stream
    headers = list(headers)
    if chunked:
        headers.append(_CHUNKED)
    else:
        message.keep_alive = False  # the close ends an unframed body
    head = conn.head(message, status, headers)
    transport = conn.transport
    if transport is not None and not transport.is_closing():
        transport.write(head + (b"%x\r\n%b\r\n" % (len(first), first) if chunked else first))
    return stream


def _refusal_body(status: int, message: str, code: str) -> bytes:
    # The OpenAI error shape of frota.router.errors, which builds on this module.
    type_ = "internal_error" if status >= 500 else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()


def _refusal(refused: Refusal) -> Response:
    return Response(refused[0], _refusal_body(*refused),
                    [("Content-Type", "application/json; charset=utf-8")])


_TOO_MANY_BODY = json.dumps({"error": {
    "message": TOO_MANY_CONNECTIONS, "type": "service_unavailable", "param": None,
    "code": "too_many_connections"}}).encode()
_TOO_MANY_HEAD = (f"{_STATUS_LINES[503]}Content-Type: application/json; charset=utf-8\r\n"
                  f"Retry-After: {RETRY_AFTER_S}\r\nContent-Length: {len(_TOO_MANY_BODY)}\r\n"
                  "Connection: close\r\n")


_NO_HEADERS = Headers(b"")


class _Refused(Exception):
    """Raised in a parser callback: stop parsing, this request is refused."""


class _Message:
    """A request as the parser delivers it: the head, then the body piece by piece."""

    __slots__ = ("_waiter", "complete", "expect_continue", "headers", "keep_alive", "lines",
                 "method", "num_body_bytes", "num_head_bytes", "parts", "refusal", "target",
                 "version")

    def __init__(self) -> None:
        self.method = ""
        self.target = ""
        self.version = "1.1"
        self.headers = _NO_HEADERS  # once the head is in
        self.lines: list[bytes] = []  # header lines, as the slow parser delivers them
        self.keep_alive = True
        self.expect_continue = False
        self.num_head_bytes = 0
        self.num_body_bytes = 0
        self.parts: list[bytes] = []
        self.complete = False
        self.refusal: Refusal | None = None
        self._waiter: asyncio.Future[None] | None = None

    def body(self) -> bytes:
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def settle(self) -> None:
        """The body is complete or refused: wake whoever waits for it."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_for_body(self) -> None:
        while not self.complete and self.refusal is None:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


def _over_held(queue: deque[_Message]) -> bool:
    """Whether a connection holds too many requests received ahead of their turn to read
    on: MAX_PIPELINED, or bodies over MAX_PIPELINED_BODY_BYTES (the one being answered
    counted; a request alone is never too much)."""
    return len(queue) > 1 and (len(queue) >= MAX_PIPELINED or sum(
        m.num_body_bytes for m in queue) > MAX_PIPELINED_BODY_BYTES)


class _HeaderCallbacks:
    """The callbacks of a connection's `slow` parser: the connection's own, and the
    header callback, which its fast parser goes without."""

    def __init__(self, conn: _Connection) -> None:
        self.on_message_begin = conn.on_message_begin
        self.on_url = conn.on_url
        self.on_header = conn.header_line
        self.on_headers_complete = conn.on_headers_complete
        self.on_body = conn.on_body
        self.on_message_complete = conn.on_message_complete


class _Connection(asyncio.Protocol):
    """One client connection: parses its requests and answers them in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # Two parsers (see `_feed`): `parser` reads whole heads handed to it alone, with no
        # callback per header, and then their bodies; `slow`, made when first needed, has
        # the header callback and reads whatever `parser` cannot be given.
        self.parser = httptools.HttpRequestParser(self)
        self.slow: httptools.HttpRequestParser | None = None
        self.slow_reading = False  # `slow` is in the middle of a request
        self.fast_head: Headers | None = None  # of the head handed to `parser`
        self.fast_length = 0  # its body's declared length
        self.body_left = 0  # bytes of the body `parser` still expects
        self.partial: _Message | None = None  # being received, head or body
        self.in_head = False
        self.num_requests = 0  # received whole
        self.queue: deque[_Message] = deque()  # whose heads are in, in order; [0] is served
        self.stopped = False  # parsing is over: refused, or the client said it closes
        self.reading_paused = False
        self.task: asyncio.Task[None] | None = None  # answering `queue`
        self.handling = False  # a handler is running or its answer is being written
        self.closing = False  # the last head written said `Connection: close`
        self.stream: ResponseStream | None = None
        self.writing_paused = False
        self.write_paused_at = 0.0  # when writing last paused
        self.closing_since: float | None = None  # when `expire` first saw it closing
        self.drained: asyncio.Future[None] | None = None  # `_answer_all` waits for resume
        # A stream's (pause, resume) for its source, while one is being written.
        self.flow: tuple[Callable[[], None], Callable[[], None]] | None = None
        # When the connection is closed unless a request is handled by then.
        self.deadline = self.loop.time() + server.limits.keepalive_timeout

    @property
    def busy(self) -> bool:
        """A request is being read, answered or queued, or an answer is still being
        flushed."""
        transport = self.transport
        return bool(self.partial is not None or self.queue or (
            transport is not None and transport.get_write_buffer_size()))

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        if len(server.connections) >= server.limits.max_connections:
            self._turn_away()
            return
        server.connections.add(self)
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH,  # type: ignore[attr-defined]
                                          WRITE_BUFFER_LOW)

    def connection_lost(self, exc: BaseException | None) -> None:
        server = self.server
        server.connections.discard(self)
        server.turned_away.discard(self)
        self.transport = None
        self.flow = None
        if self.task is not None:
            self.task.cancel()

    def pause_writing(self) -> None:
        """The client is behind by WRITE_BUFFER_HIGH: read nothing more (no request more
        can be answered until it catches up) and pause a stream's source."""
        self.writing_paused = True
        self.write_paused_at = self.loop.time()
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        if self.flow is not None:
            self.flow[0]()

    def resume_writing(self) -> None:
        self.writing_paused = False
        drained = self.drained
        if drained is not None:
            self.drained = None
            if not drained.done():
                drained.set_result(None)
        if self.reading_paused:
            self._resume_reading()
        if self.flow is not None:
            self.flow[1]()

    def _resume_reading(self) -> None:
        """Read again, once nothing holds reading paused: a refusal or a close, unsent
        bytes over WRITE_BUFFER_HIGH, or requests held over MAX_PIPELINED (or their
        bodies over MAX_PIPELINED_BODY_BYTES)."""
        if self.stopped or self.writing_paused or self.transport is None or _over_held(
                self.queue):
            return
        self.reading_paused = False
        self.transport.resume_reading()

    def _turn_away(self) -> None:
        """Over `max_connections`: answer a 503 before reading anything, say that nothing
        more will be sent (FIN), and discard what the client sends until it closes, for
        at most TURN_AWAY_LINGER seconds: closing with its request unread would send a
        reset, which can destroy the 503 before the client has read it. Past
        MAX_TURNED_AWAY lingering at once (a flood), reset at once."""
        server = self.server
        transport = self.transport
        assert transport is not None
        self.stopped = True  # `data_received` discards
        server.count_cut("max_connections")
        if len(server.turned_away) >= MAX_TURNED_AWAY:
            transport.abort()
            return
        server.turned_away.add(self)
        transport.write(_TOO_MANY_HEAD.encode("latin-1") + server.head_end.encode("latin-1")
                        + _TOO_MANY_BODY)
        if transport.can_write_eof():
            transport.write_eof()
        self.deadline = self.loop.time() + TURN_AWAY_LINGER  # then `HttpServer._sweep` aborts

    def data_received(self, data: bytes) -> None:
        if self.stopped:
            return
        try:
            self._feed(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Refused):
                raise
        except httptools.HttpParserUpgrade:  # refused in on_headers_complete already
            pass
        except httptools.HttpParserError as exc:
            reason = (str(exc).strip() or "unparsable")[:200]
            self._refuse((400, f"malformed HTTP request ({reason})", "bad_request"))

    def _feed(self, data: bytes) -> None:
        """Parse `data`. A request whose whole head is in it, and whose body (if any) has
        a Content-Length, is read the fast way: its header lines are split here in one
        pass (`Headers`), and the head and the body (as much of it as the head declares
        and `data` holds) go to `parser`, which checks them without a callback per header
        (such a call, with its two new bytes objects, costs more than the header's share
        of the split: docs/benchmarks.md, "Where the time goes"). Anything else (a head
        split over reads, a chunked body, blank lines before a request) goes to `slow`, a
        parser with the header callback, until a read leaves it between requests."""
        pos, size = 0, len(data)
        while pos < size:
            if self.body_left:  # of a request whose head came in an earlier read
                stop = min(pos + self.body_left, size)
                self.body_left -= stop - pos
            else:
                end = -1 if self.slow_reading else self._whole_head(data, pos)
                if end < 0:
                    self._feed_slow(data if not pos else data[pos:])
                    return
                stop = min(end, size)
                self.body_left = end - stop
            self.parser.feed_data(data if stop == size and not pos else data[pos:stop])
            pos = stop

    def _whole_head(self, data: bytes, pos: int) -> int:
        """Where the request that begins at `pos` in `data` ends (its body may go on in
        later reads), when its head is whole in `data` and declares its body's length;
        then its headers are noted for `parser`'s callbacks. Otherwise -1: `slow` reads
        it."""
        end = data.find(b"\r\n\r\n", pos)
        if end < 0 or data[pos] in b"\r\n":
            return -1
        line_end = data.find(b"\r\n", pos)
        head = Headers(data[line_end + 2:end]) if line_end < end else _NO_HEADERS
        if "transfer-encoding" in head.first:
            return -1
        length = _declared_length(head)
        if length is None:  # `slow` gives llhttp's 400
            return -1
        self.fast_head, self.fast_length = head, length
        return end + 4 + length

    def _feed_slow(self, data: bytes) -> None:
        if self.slow is None:
            self.slow = httptools.HttpRequestParser(_HeaderCallbacks(self))
        self.slow_reading = True
        began_in_head, num_requests = self.in_head, self.num_requests
        self.slow.feed_data(data)
        if self.partial is None:
            self.slow_reading = False  # between requests: the next head may go the fast way
        elif self.in_head:
            # A head still incomplete: count what it has received so far, which bounds
            # what the parser buffers. Exact when it began at the start of this data or
            # before; one that began after another request in the same data is counted
            # from the next data on.
            partial = self.partial
            if began_in_head:
                partial.num_head_bytes += len(data)
            elif self.num_requests == num_requests:
                partial.num_head_bytes = len(data)
            if partial.num_head_bytes > self.server.limits.max_header_bytes:
                self._refuse(HEAD_TOO_LARGE)

    # -- parser callbacks
    def on_message_begin(self) -> None:
        self.partial = _Message()
        self.in_head = True
        self.deadline = self.loop.time() + self.server.limits.keepalive_timeout

    def on_url(self, url: bytes) -> None:
        message = self.partial
        assert message is not None
        message.target += url.decode("latin-1")

    def header_line(self, name: bytes, value: bytes) -> None:
        """`slow`'s header callback."""
        message = self.partial
        assert message is not None
        message.lines.append(b"%b: %b" % (name, value))
        if len(message.lines) > MAX_HEADERS:
            self._refuse(HEAD_TOO_LARGE)
            raise _Refused

    def on_headers_complete(self) -> None:
        message = self.partial
        assert message is not None
        self.in_head = False
        head = self.fast_head
        if head is None:  # read by `slow`
            message.headers = head = Headers(b"\r\n".join(message.lines))
            length = _declared_length(head)
            assert length is not None  # llhttp has checked it is a number
        else:
            message.headers = head
            length = self.fast_length
            self.fast_head = None
        parser = self.slow if self.slow_reading else self.parser
        assert parser is not None
        message.method = parser.get_method().decode("ascii")
        message.version = parser.get_http_version()
        message.keep_alive = parser.should_keep_alive()
        self.queue.append(message)
        refused = self._refusal_of(message, length)
        if refused is not None:
            self._refuse(refused)
            raise _Refused
        self._start()

    def on_body(self, body: bytes) -> None:
        message = self.partial
        assert message is not None
        message.num_body_bytes += len(body)
        if message.num_body_bytes > self.server.limits.max_body:
            self._refuse(BODY_TOO_LARGE)
            raise _Refused
        message.parts.append(body)

    def on_message_complete(self) -> None:
        message = self.partial
        assert message is not None
        self.partial = None
        self.num_requests += 1
        message.complete = True
        message.settle()
        if not message.keep_alive:  # nothing after it is read
            self.stopped = True
            raise _Refused
        queue = self.queue
        if len(queue) > 1 and not self.reading_paused and _over_held(queue):
            self.reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def _refusal_of(self, message: _Message, length: int) -> Refusal | None:
        """What the head alone (and the body's declared `length`) says to refuse the
        request with, if anything. It also notes whether a 100-continue is expected."""
        lines, first = message.headers.lines, message.headers.first
        if len(lines) > MAX_HEADERS:
            return HEAD_TOO_LARGE
        expect = first.get("expect")
        message.expect_continue = expect is not None and _value(expect).lower() == "100-continue"
        if message.method == "CONNECT" or (
                "upgrade" in first and "upgrade" in _value(first.get("connection", ":")).lower()):
            return NO_UPGRADES
        if len(message.target) + sum(map(len, lines)) > self.server.limits.max_header_bytes:
            return HEAD_TOO_LARGE
        if length > self.server.limits.max_body:
            return BODY_TOO_LARGE
        if "host" not in first and message.version == "1.1":
            return NO_HOST
        return None

    def _refuse(self, refused: Refusal) -> None:
        """Refuse the request being received (or a new one, when none is) once its turn
        comes, and read nothing more."""
        self.stopped = True
        self.in_head = False
        message = self.partial
        if message is None:
            message = _Message()
            self.queue.append(message)
        elif not self.queue or self.queue[-1] is not message:
            self.queue.append(message)
        self.partial = None
        if message.refusal is None:
            message.refusal = refused
            log.debug("refusing a request: %s", refused[1])
        message.settle()
        if self.transport is not None:
            self.transport.pause_reading()
        self._start()

    # -- answering
    def _start(self) -> None:
        if self.task is None:
            self.task = self.loop.create_task(self._answer_all())
            self.server.tasks.add(self.task)

    async def _answer_all(self) -> None:
        server = self.server
        try:
            while self.queue and self.transport is not None and not self.transport.is_closing():
                message = self.queue[0]
                if message.refusal is None and not message.complete:
                    if message.expect_continue and self.transport is not None:
                        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await message.wait_for_body()
                if message.refusal is not None:
                    self._write(message, _refusal(message.refusal), close=True)
                    return
                self.handling = True
                try:
                    await self._handle(message)
                finally:
                    self.handling = False
                    self.stream = None
                    self.flow = None
                self.queue.popleft()
                if self.writing_paused:  # the client is behind: answer nothing more, and
                    # read nothing (`pause_writing`), until it has caught up
                    self.drained = self.loop.create_future()
                    await self.drained
                if self.reading_paused:
                    self._resume_reading()
                if self.partial is None:  # else the request being received keeps its own
                    self.deadline = self.loop.time() + server.limits.keepalive_timeout
        finally:
            server.tasks.discard(self.task)  # type: ignore[arg-type]
            self.task = None

    async def _handle(self, message: _Message) -> None:
        request = Request(self, message)
        try:
            answer = await self.server.handler(request)
        except Exception:
            if request.client_gone:
                return
            log.exception("unhandled error serving %s %s", message.method, message.target)
            if self.stream is not None:  # a stream broke off: end it by closing
                self._close()
                return
            answer = _refusal(INTERNAL)
        if isinstance(answer, ResponseStream):
            answer.end()
            if self.closing:
                self._close()
            return
        self._write(message, answer)

    def head(self, message: _Message, status: int, headers: list[tuple[str, str]],
             length: int | None = None) -> bytes:
        """The answer's head; says (and notes) `Connection: close` when the connection
        closes after it."""
        close = self.closing = not message.keep_alive or self.server.draining
        lines = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers]
        if length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        if close:
            lines.append("Connection: close\r\n")
        elif message.version == "1.0":
            lines.append("Connection: keep-alive\r\n")
        lines.append(self.server.head_end)
        return "".join(lines).encode("latin-1")

    def _write(self, message: _Message, response: Response, *, close: bool = False) -> None:
        if close:
            message.keep_alive = False
        body = response.body
        status = response.status
        no_body = status < 200 or status in (204, 304)
        head = self.head(message, status, response.headers, None if no_body else len(body))
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(head if no_body or message.method == "HEAD" else head + body)
        if self.closing:
            self._close()

    def _close(self) -> None:
        """Close once what was written is sent; nothing more is read or answered."""
        self.stopped = True
        if self.transport is not None:
            self.transport.close()

    def expire(self, now: float) -> None:
        """Close the connection when it has been idle, or a request has taken to arrive,
        for longer than `keepalive_timeout`; abort it when the client has taken none of
        its answer for `write_timeout` (writing paused, or closing with bytes unsent)."""
        transport = self.transport
        if transport is None:
            return
        if self.closing_since is None and transport.is_closing():
            self.closing_since = now
        if self.writing_paused or self.closing_since is not None:
            stalled_since = self.write_paused_at if self.writing_paused else self.closing_since
            assert stalled_since is not None
            if now - stalled_since >= self.server.limits.write_timeout:
                log.debug("aborting a connection whose client took nothing for %.0f s",
                          now - stalled_since)
                self.server.count_cut("write_timeout")
                transport.abort()
            return
        if not self.handling and now >= self.deadline:
            if self.queue and self.queue[0].complete:
                return  # about to be answered
            self._close()


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may make a server hold, and for how long (the module docstring says
    what each bounds). Limits that would leave no room to serve are refused (ValueError)."""

    max_body: int = MAX_BODY
    max_header_bytes: int = MAX_HEADER_BYTES
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    write_timeout: float = WRITE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        if not self.keepalive_timeout > 0 or not self.write_timeout > 0:
            raise ValueError(f"keepalive_timeout and write_timeout must be above 0, not "
                             f"{self.keepalive_timeout:g} and {self.write_timeout:g}")


class HttpServer:
    """Listens and serves `handler` (see the module docstring for what it refuses and
    what it bounds)."""

    def __init__(self, handler: Handler, limits: Limits = Limits(), *,
                 on_cut: Callable[[str], None] | None = None) -> None:
        """`on_cut(reason)` hears of each connection the server turns away or cuts off for
        one of its limits: `max_connections`, `write_timeout` (for a metric)."""
        self.handler = handler
        self.limits = limits
        self.on_cut = on_cut
        self.connections: set[_Connection] = set()
        self.turned_away: set[_Connection] = set()  # over max_connections, lingering
        self.draining = False
        self.tasks: set[asyncio.Task[Any]] = set()  # connections answering
        self.head_end = ""  # the Date header and the head's blank line
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def count_cut(self, reason: str) -> None:
        if self.on_cut is not None:
            self.on_cut(reason)

    async def listen(self, host: str, port: int, *, backlog: int = 2048,
                     reuse_port: bool = False) -> int:
        """Start listening; returns the port (useful with port 0). With `reuse_port`,
        other processes may listen on the same port (SO_REUSEPORT), and the kernel
        spreads new connections among them."""
        self._reserve_fds()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=backlog, reuse_address=True,
            reuse_port=reuse_port)
        self._serve(server)
        return server.sockets[0].getsockname()[1]

    async def listen_unix(self, path: str) -> None:
        """Start listening on a Unix socket at `path` (a stale socket file there is
        replaced)."""
        loop = asyncio.get_running_loop()
        self._serve(await loop.create_unix_server(lambda: _Connection(self), path))

    def _reserve_fds(self) -> None:
        """Raise the process's soft limit on open files, up to its hard limit, to what
        `max_connections` needs, so that the cap, not a failing accept(), is what turns
        clients away; warn when the hard limit is lower."""
        needed = self.limits.max_connections + MAX_TURNED_AWAY + NUM_OTHER_FDS
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
        if soft != resource.RLIM_INFINITY and soft < needed:
            log.warning("max_connections %d needs about %d open files, and the process may "
                        "open %d: accept() will fail before the cap is reached",
                        self.limits.max_connections, needed, soft)

    def _serve(self, server: asyncio.AbstractServer) -> None:
        self._tick()
        self._server = server
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def close(self, grace: float = 5.0, idle_grace: float = DRAIN_IDLE_GRACE) -> None:
        """Stop accepting and drain: requests in flight get `grace` seconds, and every
        answer from now on says `Connection: close`. A connection is closed once it has
        been idle for `idle_grace`; what is left at `grace` is cut off."""
        if self._server is None:
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
                    conn._close()
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        cut = [conn for conn in self.connections if conn.transport is not None]
        if cut:
            busy = sum(conn.busy for conn in cut)
            log.warning("drain: %.0f s grace over, cutting %d connection(s), %d with a "
                        "request in flight", grace, len(cut), busy)
        for conn in cut + list(self.turned_away):
            conn.transport.abort()  # type: ignore[union-attr]
        if self.tasks:  # cancelled by their connections' loss
            await asyncio.wait(list(self.tasks), timeout=1.0)
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._server = self._sweeper = None

    def _tick(self) -> None:
        self.head_end = f"Date: {formatdate(usegmt=True)}\r\n\r\n"

    async def _sweep(self) -> None:
        """Keep the Date header current, close connections past their deadline, and abort
        those turned away that linger past theirs."""
        loop = asyncio.get_running_loop()
        interval = min(1.0, self.limits.keepalive_timeout / 4, self.limits.write_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            self._tick()
            now = loop.time()
            for conn in list(self.connections):
                conn.expire(now)
            for conn in list(self.turned_away):
                if now >= conn.deadline and conn.transport is not None:
                    conn.transport.abort()
