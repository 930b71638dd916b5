"""The router's HTTP/1.1 client to its workers: pooled keep-alive connections whose
responses are read whole, chunk by chunk, or relayed straight into a client's stream.

A relayed stream costs one `data_received` per chunk. When the worker's body is chunked
and the client's stream is too, the bytes go on as they came, framing and all, to the
raw sink (`frota.router.server.ResponseStream.write_raw`) from the first chunk boundary
on; otherwise httptools (llhttp) strips the framing and the sink gets the pieces. The
parser's body and chunk callbacks are C methods (a list's `append` and `clear`), not
Python functions, so a relayed chunk runs one Python frame here. No reader buffer,
future or task wake-up per chunk; the relay's one future resolves when the worker's
response ends. That is why it is hand-written: it costs half the CPU per stream of
aiohttp's client (docs/benchmarks.md, "Overhead").

- Connections are kept per worker (LIFO, so the warmest is reused) and closed after
  `idle_timeout` unused. A reused connection the worker closed meanwhile (a
  keep-alive race: nothing of the response arrived) is retried once on a fresh one.
- `read_timeout` is the longest silence from a worker mid-response (waiting for the
  headers included); one sweeper task checks all busy connections every second, so a
  connection times out up to two seconds after its silence passed `read_timeout`.
- Failures raise `UpstreamError` with a `reason` the proxy turns into retries
  and metrics: `connect_error`, `disconnected`, `timeout`, `bad_response`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import httptools

HeaderList = list[tuple[str, str]]
_FRAMING = frozenset({"content-length", "transfer-encoding"})
Sink = Callable[[bytes], None]


class UpstreamError(Exception):
    """A worker could not be reached or its response broke off."""

    def __init__(self, reason: str, detail: str, *, nothing_received: bool = False) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.nothing_received = nothing_received  # not a byte of the response arrived
        # Raw bytes of an unfinished chunk went to the sink: nothing can follow them.
        self.mid_chunk = False


class UpstreamResponse:
    """A worker's response: status and headers once `UpstreamClient.request` returns, the
    body after. Read it with `next_chunk`/`read`, or hand it to a sink with `relay`."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_done",
        "_error",
        "_head",
        "_loop",
        "_raw",
        "_relayed",
        "_sink",
        "_waiter",
        "chunked",
        "content_type",
        "framed",
        "headers",
        "names",
        "status",
    )

    def __init__(self, conn: _WorkerConnection) -> None:
        self._loop = loop = conn.loop
        self.status = 0
        self.headers: HeaderList = []
        self.names: list[str] = []  # the headers' names in lower case, in the same order
        self.content_type = ""  # its media type in lower case, without parameters
        self.framed = False  # a Content-Length or Transfer-Encoding says where the body ends
        self.chunked = False  # the body comes in HTTP/1.1 chunks
        self._conn: _WorkerConnection | None = conn
        self._head: asyncio.Future[None] = loop.create_future()
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: UpstreamError | None = None
        self._sink: Sink | None = None
        self._raw: Sink | None = None  # wants the chunked bytes as they come
        self._relayed: asyncio.Future[bool] | None = None

    @property
    def complete(self) -> bool:
        return self._done

    async def next_chunk(self) -> bytes:
        """The next piece of the body as it arrived; b"" once the body is complete."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._chunks.popleft()

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        if self._done:  # often so: a short body arrives with its headers
            parts = list(self._chunks)
            self._chunks.clear()
            return b"".join(parts)
        parts = []
        while chunk := await self.next_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def relay(self, sink: Sink, raw: Sink | None = None) -> asyncio.Future[bool]:
        """From now on call `sink` with each piece of the body as it arrives (buffered
        pieces first). With `raw`, a chunked body goes to `raw` instead from its next
        chunk boundary on, as the worker framed it, end of body included. The future
        resolves at the end of the body (True when the end went to `raw`), or raises
        `UpstreamError` when the worker breaks off."""
        self._relayed = self._loop.create_future()
        while self._chunks:
            sink(self._chunks.popleft())
        if self._error is not None:
            self._relayed.set_exception(self._error)
        elif self._done:
            self._relayed.set_result(False)
        else:
            self._sink = sink
            if raw is not None and self.chunked:
                self._raw = raw
                if self._conn is not None:
                    self._conn.pass_raw_at_boundary(raw)
        return self._relayed

    def pause_reading(self) -> None:
        if self._conn is not None and not self._done:
            self._conn.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._conn is not None and not self._done:
            self._conn.transport.resume_reading()

    def close(self) -> None:
        """Done with it: an unfinished response is cut off (the worker sees the disconnect
        and stops generating); a finished one's connection is already back in the pool."""
        conn, self._conn = self._conn, None
        self._sink = self._raw = None
        if conn is not None and not self._done:
            conn.raw = None
            conn.transport.abort()

    # -- fed by the connection
    def _on_body(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(data)
            return
        self._chunks.append(data)
        self._wake()

    def _on_end(self, raw: bool = False) -> None:
        self._done = True
        self._conn = None
        self._sink = self._raw = None
        if self._relayed is not None and not self._relayed.done():
            self._relayed.set_result(raw)
        self._wake()

    def _wake(self) -> None:
        """Let a `next_chunk` waiting for data look again."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _on_error(self, error: UpstreamError) -> None:
        self._conn = None
        self._sink = self._raw = None
        if not self._head.done():
            self._head.set_exception(error)
            return
        self._error = error
        if self._relayed is not None and not self._relayed.done():
            self._relayed.set_exception(error)
        self._wake()


class _WorkerConnection(asyncio.Protocol):
    """One keep-alive connection to a worker, serving one response at a time."""

    def __init__(self, client: UpstreamClient, key: str) -> None:
        self.client = client
        self.key = key
        # Noted once: on Python 3.11, each `asyncio.get_running_loop()` is a getpid system
        # call, which would be one per request (its response's futures come from here).
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.response: UpstreamResponse | None = None
        # The parser's callbacks that run once per chunk, as C methods: the body pieces
        # of the data being parsed, and whether a chunk has begun and not ended.
        self.pieces: list[bytes] = []
        self.on_body = self.pieces.append
        self.open_chunk: list[None] = []
        self.on_chunk_header = functools.partial(self.open_chunk.append, None)
        self.on_chunk_complete = self.open_chunk.clear
        self.last_data = b""  # of this response: b"" until its first byte
        self.raw: Sink | None = None  # the response's raw sink, once at a chunk boundary
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.heard = False  # data came since the sweeper last looked
        self.quiet_since = 0.0  # when the sweeper last saw it quiet
        self.read_timeout: float | None = None
        self.until_close = False  # a body without length or chunking runs to the close

    def send(self, response: UpstreamResponse, data: bytes, read_timeout: float | None) -> None:
        self.response = response
        self.last_data = b""
        self.read_timeout = read_timeout
        self.heard = False
        self.quiet_since = time.monotonic()
        self.client.busy.add(self)
        self.transport.write(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.heard = True
        self.last_data = data
        raw = self.raw
        if raw is not None:
            raw(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._deliver()
            self.fail(UpstreamError("bad_response", f"unparsable HTTP response ({exc})"))
            self.transport.abort()
            return
        if self.pieces:
            if raw is not None:
                self.pieces.clear()  # they went on raw
            else:
                self._deliver()
                response = self.response
                if response is not None and response._raw is not None:  # not yet raw
                    self.pass_raw_at_boundary(response._raw)

    def _deliver(self) -> None:
        """Hand the body pieces parsed from the last data to the response (unless they
        went on raw)."""
        response = self.response
        if response is not None and self.raw is None:
            sink = response._sink
            for piece in self.pieces:
                if sink is not None:
                    sink(piece)
                else:
                    response._on_body(piece)
        self.pieces.clear()

    def at_chunk_boundary(self) -> bool:
        """Whether all data so far ends exactly between two chunks (or before the first):
        no chunk begun and not ended, nor part of a size line parsed."""
        return not self.open_chunk and self.last_data.endswith(b"\r\n")

    def pass_raw_at_boundary(self, raw: Sink) -> None:
        """Start passing the data on to `raw`, if the response's body is at a chunk
        boundary now; else this is asked again after the next data."""
        if self.at_chunk_boundary():
            self.raw = raw

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client.forget(self)
        response = self.response
        if response is None:
            return
        if self.until_close and response._head.done():
            self.response = None
            response._on_end()  # the close is the end of such a body
            return
        detail = f"connection lost ({type(exc).__name__ if exc else 'closed by the worker'})"
        self.fail(UpstreamError("disconnected", detail, nothing_received=not self.last_data))

    def fail(self, error: UpstreamError) -> None:
        response, self.response = self.response, None
        self.client.busy.discard(self)
        if self.raw is not None:
            error.mid_chunk = not self.at_chunk_boundary()
            self.raw = None
        if response is not None:
            response._on_error(error)

    # -- parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if response is None:
            return
        header = (name.decode("latin-1"), value.decode("latin-1"))
        response.headers.append(header)
        lower = header[0].lower()
        response.names.append(lower)
        if lower in _FRAMING:
            response.framed = True
            if lower == "transfer-encoding":
                # Chunked alone: bytes under another coding are not passed on raw.
                response.chunked = header[1].strip().lower() == "chunked"
        elif lower == "content-type" and not response.content_type:
            response.content_type = header[1].split(";", 1)[0].strip().lower()

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        response.status = self.parser.get_status_code()
        self.until_close = not response.framed and response.status not in (204, 304)
        if not response._head.done():
            response._head.set_result(None)

    def on_message_complete(self) -> None:
        if self.pieces:
            self._deliver()
        response, self.response = self.response, None
        raw, self.raw = self.raw, None
        self.client.busy.discard(self)
        keep = self.parser.should_keep_alive() and not self.until_close
        if response is not None:
            response._on_end(raw is not None)
        if keep and not self.closed:
            self.transport.resume_reading()  # a relay may have paused it; nobody else resumes
            self.client.release(self)
        else:
            self.transport.close()


class UpstreamClient:
    """Pooled HTTP/1.1 connections to workers, by base URL (`http://host:port[/prefix]`)."""

    def __init__(self, *, connect_timeout: float = 3.0, read_timeout: float | None = 600.0,
                 idle_timeout: float = 15.0) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.idle: dict[str, list[tuple[float, _WorkerConnection]]] = {}
        self.busy: set[_WorkerConnection] = set()
        self._origins: dict[str, tuple[str, int, str, str]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def request(self, base_url: str, method: str, target: str,
                      headers: Iterable[tuple[str, str]], body: bytes = b"", *,
                      lines: Iterable[str] = (),
                      read_timeout: float | None = None) -> UpstreamResponse:
        """Send a request to the worker at `base_url`; return once its response headers
        are in. `lines` are more headers, as lines ("Name: value") ready to send: a
        client's, forwarded as it sent them. Raises `UpstreamError`."""
        host, port, host_header, prefix = self._origin(base_url)
        # Each header line joined in C (`": ".join` mapped over the pairs), not formatted
        # by a Python loop.
        head = [f"{method} {prefix}{target} HTTP/1.1\r\nHost: {host_header}", *lines,
                *map(": ".join, headers)]
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}")
        head.append("\r\n")
        data = "\r\n".join(head).encode("latin-1") + body
        timeout = read_timeout if read_timeout is not None else self.read_timeout
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        for _ in range(2):
            conn = self._idle_connection(base_url)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(base_url, host, port)
            response = UpstreamResponse(conn)
            conn.send(response, data, timeout)
            try:
                await response._head
            except UpstreamError as exc:
                if reused and exc.reason == "disconnected" and exc.nothing_received:
                    continue  # the worker closed this idle connection as we reused it
                raise
            except asyncio.CancelledError:
                response.close()
                raise
            return response
        raise UpstreamError("disconnected", "the worker closed two connections in a row")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for idle in self.idle.values():
            for _, conn in idle:
                conn.transport.close()
        for conn in list(self.busy):
            conn.transport.abort()
        self.idle.clear()

    # -- the pool
    def _origin(self, base_url: str) -> tuple[str, int, str, str]:
        origin = self._origins.get(base_url)
        if origin is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"worker URL {base_url!r}: only http://host[:port] is supported")
            port = parts.port or 80
            host_header = parts.netloc.rsplit("@", 1)[-1]
            origin = (parts.hostname, port, host_header, parts.path.rstrip("/"))
            self._origins[base_url] = origin
        return origin

    def _idle_connection(self, key: str) -> _WorkerConnection | None:
        """The warmest kept-alive connection to `key` still usable, if any (no coroutine:
        the usual case, once per request)."""
        idle = self.idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            since, conn = idle.pop()
            if not conn.closed and now - since < self.idle_timeout:
                return conn
            conn.transport.close()
        return None

    async def _connect(self, key: str, host: str, port: int) -> _WorkerConnection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _WorkerConnection(self, key), host, port),
                self.connect_timeout)
        except (TimeoutError, OSError) as exc:
            raise UpstreamError("connect_error", f"{host}:{port}: {exc!r}") from exc
        return conn

    def release(self, conn: _WorkerConnection) -> None:
        self.idle.setdefault(conn.key, []).append((time.monotonic(), conn))

    def forget(self, conn: _WorkerConnection) -> None:
        self.busy.discard(conn)
        idle = self.idle.get(conn.key)
        if idle:
            self.idle[conn.key] = [(t, c) for t, c in idle if c is not conn]

    async def _sweep(self) -> None:
        """Every second: time out busy connections silent for longer than their read
        timeout, and close idle ones unused for `idle_timeout`."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for conn in list(self.busy):
                if conn.heard:  # noted here, not per chunk: a clock read per chunk costs
                    conn.heard = False
                    conn.quiet_since = now
                elif (conn.read_timeout is not None
                      and now - conn.quiet_since > conn.read_timeout):
                    conn.fail(UpstreamError(
                        "timeout", f"no data from the worker for {conn.read_timeout:g}s"))
                    conn.transport.abort()
            for key, idle in list(self.idle.items()):
                stale = [conn for since, conn in idle if now - since >= self.idle_timeout]
                if stale:
                    self.idle[key] = [(t, c) for t, c in idle if c not in stale]
                    for conn in stale:
                        conn.transport.close()
