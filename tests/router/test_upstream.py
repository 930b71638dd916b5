"""The router's HTTP/1.1 client to workers (`frota.router.upstream`), against real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from frota.router.upstream import UpstreamClient, UpstreamError

TIMEOUT = 5.0
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def send_apart(writer: asyncio.StreamWriter, data: bytes, pause: float) -> None:
    """Write and flush `data`, then pause, so the client reads it apart from what follows."""
    writer.write(data)
    await writer.drain()
    await asyncio.sleep(pause)


@dataclass
class RawWorker:
    """A worker on a raw socket: `handle(worker, reader, writer)` serves each connection."""

    port: int = 0
    num_connections: int = 0
    requests: list[bytes] = field(default_factory=list)  # each request's head and body

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """One request off the wire (b"" at EOF); bodies have a Content-Length."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return b""
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


Handle = Callable[[RawWorker, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
StartRaw = Callable[[Handle], Awaitable[RawWorker]]


@pytest.fixture
async def start_raw() -> AsyncIterator[StartRaw]:
    servers: list[asyncio.AbstractServer] = []
    tasks: set[asyncio.Task] = set()

    async def start(handle: Handle) -> RawWorker:
        worker = RawWorker()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            worker.num_connections += 1
            try:
                await handle(worker, reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
                tasks.discard(task)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        servers.append(server)
        worker.port = server.sockets[0].getsockname()[1]
        return worker

    yield start
    for server in servers:
        server.close()
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=TIMEOUT)


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    upstream = UpstreamClient(connect_timeout=2.0, read_timeout=None)
    yield upstream
    await upstream.close()


async def start_app(app: web.Application, **kwargs: object) -> TestServer:
    server = TestServer(app)
    await server.start_server(**kwargs)
    return server


def peer_counting_app(peers: list[tuple[str, int]]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text=f"hi {len(peers)}")

    app = web.Application()
    app.router.add_get("/hi", handle)
    return app


async def test_sequential_requests_reuse_one_connection(client):
    peers: list[tuple[str, int]] = []
    server = await start_app(peer_counting_app(peers))
    try:
        url = str(server.make_url("")).rstrip("/")
        for i in range(1, 4):
            response = await client.request(url, "GET", "/hi", [])
            assert response.status == 200
            assert await response.read() == f"hi {i}".encode()
            assert response.complete
        assert len(peers) == 3 and len(set(peers)) == 1
        assert len(client.idle[url]) == 1
        # Two at once need two connections; both go back to the pool.
        both = await asyncio.gather(*(client.request(url, "GET", "/hi", []) for _ in range(2)))
        for response in both:
            await response.read()
        assert len(set(peers)) == 2
        assert len(client.idle[url]) == 2
    finally:
        await server.close()


async def test_a_worker_closing_idle_connections_is_not_an_error(client):
    peers: list[tuple[str, int]] = []
    server = await start_app(peer_counting_app(peers), keepalive_timeout=0.05)
    try:
        url = str(server.make_url("")).rstrip("/")
        for _ in range(2):
            response = await client.request(url, "GET", "/hi", [])
            assert await response.read()
            for _ in range(200):  # the worker closes it; the pool lets it go
                if not client.idle.get(url):
                    break
                await asyncio.sleep(0.01)
            assert not client.idle.get(url)
        assert len(set(peers)) == 2
    finally:
        await server.close()


async def test_a_worker_that_closes_after_each_response_is_not_an_error(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)  # no `Connection: close`, and then it closes
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    worker = await start_raw(handle)
    for _ in range(4):  # back to back: the next request may find the closed one pooled
        response = await client.request(worker.url, "GET", "/x", [])
        assert await response.read() == b"ok"
    assert worker.num_connections == 4


async def test_a_worker_saying_connection_close_is_not_pooled(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await worker.read_request(reader)  # would answer nothing more on it

    worker = await start_raw(handle)
    for _ in range(2):
        response = await client.request(worker.url, "GET", "/x", [])
        assert await response.read() == b"ok"
        assert not client.idle.get(worker.url)
    assert worker.num_connections == 2 and len(worker.requests) == 2  # no retry needed


async def test_a_connection_idle_past_idle_timeout_is_not_reused(start_raw):
    async def handle(worker, reader, writer) -> None:
        while await worker.read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    worker = await start_raw(handle)
    client = UpstreamClient(read_timeout=None, idle_timeout=0.2)
    try:
        for _ in range(2):
            assert await (await client.request(worker.url, "GET", "/", [])).read() == b"ok"
        assert worker.num_connections == 1
        await asyncio.sleep(0.3)
        assert await (await client.request(worker.url, "GET", "/", [])).read() == b"ok"
        assert worker.num_connections == 2
    finally:
        await client.close()


async def test_a_cancelled_request_cuts_the_worker_off(client, start_raw):
    received, left = asyncio.Event(), asyncio.Event()

    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        received.set()  # and it never answers
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        left.set()

    worker = await start_raw(handle)
    pending = asyncio.create_task(client.request(worker.url, "POST", "/v1/completions", [], b"{}"))
    await asyncio.wait_for(received.wait(), TIMEOUT)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    await asyncio.wait_for(left.wait(), TIMEOUT)
    assert not client.busy and not client.idle.get(worker.url)


async def test_a_reused_connection_closed_under_the_request_is_retried_once(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
        await worker.read_request(reader)  # the second request on it: closed unanswered

    worker = await start_raw(handle)
    first = await client.request(worker.url, "POST", "/a", [], b"1")
    assert await first.read() == b"first"
    second = await client.request(worker.url, "POST", "/b", [], b"2")
    assert second.status == 200 and await second.read() == b"first"
    assert worker.num_connections == 2
    assert [r.split(b" ", 2)[1] for r in worker.requests] == [b"/a", b"/b", b"/b"]


async def test_a_fresh_connection_closed_unanswered_raises_disconnected(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)

    worker = await start_raw(handle)
    with pytest.raises(UpstreamError) as failure:
        await client.request(worker.url, "GET", "/x", [])
    assert failure.value.reason == "disconnected" and failure.value.nothing_received
    assert worker.num_connections == 1  # not retried: it was not a reused connection


async def test_connection_refused_raises_connect_error(client):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens there once it is closed
    with pytest.raises(UpstreamError) as failure:
        await client.request(f"http://127.0.0.1:{port}", "GET", "/", [])
    assert failure.value.reason == "connect_error"


async def test_a_stalled_worker_times_out(start_raw):
    stalled = asyncio.Event()

    async def handle(worker, reader, writer) -> None:
        request = await worker.read_request(reader)
        if b"/body" in request.split(b"\r\n")[0]:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfive!")
        stalled.set()
        await asyncio.sleep(30)

    worker = await start_raw(handle)
    client = UpstreamClient(read_timeout=0.3)
    try:
        response = await client.request(worker.url, "GET", "/body", [])
        assert response.status == 200
        with pytest.raises(UpstreamError) as failure:
            await asyncio.wait_for(response.read(), 2.5)
        assert failure.value.reason == "timeout"
        # Waiting for the headers counts too.
        with pytest.raises(UpstreamError) as failure:
            await asyncio.wait_for(client.request(worker.url, "GET", "/head", []), 2.5)
        assert failure.value.reason == "timeout"
        assert not client.busy and not client.idle.get(worker.url)
    finally:
        await client.close()


async def test_a_body_without_length_runs_to_the_close(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        await send_apart(writer, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
                         b"part one, ", 0.05)
        writer.write(b"part two")
        await writer.drain()

    worker = await start_raw(handle)
    response = await client.request(worker.url, "GET", "/x", [])
    assert response.content_type == "text/plain"
    assert await asyncio.wait_for(response.read(), TIMEOUT) == b"part one, part two"
    assert not client.idle.get(worker.url)  # such a connection cannot be reused


async def test_chunks_arrive_piece_by_piece(client, start_raw):
    gate = asyncio.Event()

    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        writer.write(OK_HEAD + chunk(b"data: one\n\n"))
        await gate.wait()
        await send_apart(writer, chunk(b"data: two\n\n"), 0.05)
        writer.write(chunk(b"data: three\n\n") + b"0\r\n\r\n")
        await worker.read_request(reader)  # keeps the connection open

    worker = await start_raw(handle)
    response = await client.request(worker.url, "POST", "/v1/completions", [], b"{}")
    assert response.content_type == "text/event-stream"
    # The first chunk is there before the worker sends the second.
    assert await asyncio.wait_for(response.next_chunk(), TIMEOUT) == b"data: one\n\n"
    assert not response.complete
    gate.set()
    assert await asyncio.wait_for(response.next_chunk(), TIMEOUT) == b"data: two\n\n"
    assert await asyncio.wait_for(response.next_chunk(), TIMEOUT) == b"data: three\n\n"
    assert await asyncio.wait_for(response.next_chunk(), TIMEOUT) == b""
    assert response.complete
    assert len(client.idle[worker.url]) == 1  # the connection went back to the pool


async def test_relay_delivers_buffered_then_later_chunks_in_order(client, start_raw):
    gate = asyncio.Event()

    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        await send_apart(writer, OK_HEAD + chunk(b"a"), 0.02)
        writer.write(chunk(b"b"))
        await gate.wait()
        await send_apart(writer, chunk(b"c"), 0.02)
        writer.write(chunk(b"d") + b"0\r\n\r\n")

    worker = await start_raw(handle)
    response = await client.request(worker.url, "GET", "/s", [])
    for _ in range(200):  # wait until "a" and "b" are buffered (nobody reads them yet)
        if len(response._chunks) == 2:
            break
        await asyncio.sleep(0.01)
    assert list(response._chunks) == [b"a", b"b"]
    received: list[bytes] = []
    relayed = response.relay(received.append)
    assert received == [b"a", b"b"]  # buffered pieces go to the sink at once
    assert not relayed.done()
    gate.set()
    assert await asyncio.wait_for(relayed, TIMEOUT) is False  # the end did not go on raw
    assert received == [b"a", b"b", b"c", b"d"]
    assert response.complete
    # Relaying a response that is already complete resolves at once.
    response = await client.request(worker.url, "GET", "/s", [])
    await asyncio.wait_for(response.read(), TIMEOUT)
    assert response.relay(received.append).done()


async def test_a_chunked_relay_passes_the_workers_bytes_on_from_a_chunk_boundary(
        client, start_raw):
    async def handle(worker, reader, writer) -> None:
        while await worker.read_request(reader):
            await send_apart(writer, OK_HEAD + chunk(b"a") + chunk(b"bb")[:4], 0.05)
            await send_apart(writer, chunk(b"bb")[4:], 0.05)  # the boundary: raw from here
            await send_apart(writer, chunk(b"ccc")[:3], 0.05)  # a chunk split anywhere
            writer.write(chunk(b"ccc")[3:] + chunk(b"d") + b"0\r\n\r\n")

    worker = await start_raw(handle)
    response = await client.request(worker.url, "GET", "/s", [])
    assert response.chunked
    assert await response.next_chunk() == b"a"
    for _ in range(200):  # until the first piece of "bb" is in
        if response._chunks:
            break
        await asyncio.sleep(0.01)
    pieces: list[bytes] = []
    raw: list[bytes] = []
    relayed = response.relay(pieces.append, raw.append)
    assert await asyncio.wait_for(relayed, TIMEOUT) is True  # the end went on raw
    assert pieces == [b"b", b"b"]  # mid-chunk when the relay began: unframed up to its end
    assert b"".join(raw) == chunk(b"ccc") + chunk(b"d") + b"0\r\n\r\n"
    assert len(raw) == 2  # as the data came
    again = await client.request(worker.url, "GET", "/s", [])  # the connection is reused
    assert await asyncio.wait_for(again.read(), TIMEOUT) == b"abbcccd"
    assert worker.num_connections == 1


async def test_a_body_not_chunked_is_relayed_unframed_even_when_raw_is_asked(client,
                                                                             start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        await send_apart(writer, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Content-Length: 13\r\n\r\ndata: a\r\n", 0.05)
        writer.write(b"\r\n\r\n")

    worker = await start_raw(handle)
    response = await client.request(worker.url, "GET", "/s", [])
    assert not response.chunked
    assert await response.next_chunk() == b"data: a\r\n"
    pieces: list[bytes] = []
    raw: list[bytes] = []
    assert await asyncio.wait_for(response.relay(pieces.append, raw.append), TIMEOUT) is False
    assert pieces == [b"\r\n\r\n"] and not raw


@pytest.mark.parametrize("mid_chunk", [True, False])
async def test_a_raw_relay_broken_off_says_whether_mid_chunk(client, start_raw, mid_chunk):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        await send_apart(writer, OK_HEAD + chunk(b"a"), 0.05)
        await send_apart(writer, chunk(b"bb")[:4] if mid_chunk else chunk(b"bb"), 0.05)
        writer.transport.abort()

    worker = await start_raw(handle)
    response = await client.request(worker.url, "GET", "/s", [])
    assert await response.next_chunk() == b"a"
    raw: list[bytes] = []
    with pytest.raises(UpstreamError) as failure:
        await asyncio.wait_for(response.relay(pytest.fail, raw.append), TIMEOUT)
    assert failure.value.reason == "disconnected"
    assert failure.value.mid_chunk is mid_chunk
    assert b"".join(raw) == (chunk(b"bb")[:4] if mid_chunk else chunk(b"bb"))


async def test_a_connection_broken_mid_body_fails_the_relay(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        await send_apart(writer, OK_HEAD + chunk(b"data: one\n\n"), 0.05)
        writer.transport.abort()

    worker = await start_raw(handle)
    response = await client.request(worker.url, "GET", "/s", [])
    received: list[bytes] = []
    relayed = response.relay(received.append)
    with pytest.raises(UpstreamError) as failure:
        await asyncio.wait_for(relayed, TIMEOUT)
    assert failure.value.reason == "disconnected" and not failure.value.nothing_received
    assert received == [b"data: one\n\n"]
    # Read chunk by chunk, the same break raises from next_chunk.
    response = await client.request(worker.url, "GET", "/s", [])
    with pytest.raises(UpstreamError) as failure:
        await asyncio.wait_for(response.read(), TIMEOUT)
    assert failure.value.reason == "disconnected"


async def test_closing_an_unfinished_response_cuts_the_worker_off(client, start_raw):
    left = asyncio.Event()

    async def handle(worker, reader, writer) -> None:
        request = await worker.read_request(reader)
        if b"/stream" not in request:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
            await worker.read_request(reader)
            return
        writer.write(OK_HEAD + chunk(b"data: one\n\n"))
        await writer.drain()
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""  # EOF
        left.set()

    worker = await start_raw(handle)
    response = await client.request(worker.url, "GET", "/stream", [])
    assert await asyncio.wait_for(response.next_chunk(), TIMEOUT) == b"data: one\n\n"
    response.close()
    await asyncio.wait_for(left.wait(), TIMEOUT)
    assert not client.idle.get(worker.url) and not client.busy
    after = await client.request(worker.url, "GET", "/after", [])  # on a fresh connection
    assert await after.read() == b"done"
    assert worker.num_connections == 2
    after.close()  # a finished response: its connection stays pooled
    assert len(client.idle[worker.url]) == 1


async def test_a_base_url_path_prefixes_the_target(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        while await worker.read_request(reader):
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    worker = await start_raw(handle)
    for base in (f"{worker.url}/prefix", f"{worker.url}/prefix/"):
        response = await client.request(base, "GET", "/v1/models?x=1", [])
        assert response.status == 204 and await response.read() == b""
    assert [r.split(b"\r\n")[0] for r in worker.requests] == [
        b"GET /prefix/v1/models?x=1 HTTP/1.1"] * 2


async def test_only_plain_http_urls_are_accepted(client):
    for url in ("https://127.0.0.1:1", "ftp://127.0.0.1", "127.0.0.1:8000"):
        with pytest.raises(ValueError):
            await client.request(url, "GET", "/", [])


async def test_request_headers_and_body_reach_the_worker_unchanged(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        while await worker.read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nX-Answer: yes\r\nContent-Length: 0\r\n\r\n")

    worker = await start_raw(handle)
    body = b'{"prompt":"x",   "n": [1, 2]}\r\n\x00\xff'
    headers = [("Content-Type", "application/json"), ("X-Request-Id", "Ab c"),
               ("x-lower", "v"), ("X-Request-Id", "second")]
    response = await client.request(worker.url, "POST", "/v1/completions?a=b", headers, body)
    assert response.status == 200 and ("X-Answer", "yes") in response.headers
    assert await response.read() == b""
    response = await client.request(worker.url, "GET", "/v1/models", [("Accept", "*/*")])
    await response.read()
    response = await client.request(worker.url, "POST", "/empty", [])
    await response.read()
    host = f"127.0.0.1:{worker.port}"
    assert worker.requests == [
        (f"POST /v1/completions?a=b HTTP/1.1\r\nHost: {host}\r\n"
         "Content-Type: application/json\r\nX-Request-Id: Ab c\r\nx-lower: v\r\n"
         f"X-Request-Id: second\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body,
        f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n".encode(),
        f"POST /empty HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode(),
    ]
    assert worker.num_connections == 1


async def test_an_unparsable_response_raises_bad_response(client, start_raw):
    async def handle(worker, reader, writer) -> None:
        await worker.read_request(reader)
        writer.write(b"this is not HTTP\r\n\r\n")
        await worker.read_request(reader)

    worker = await start_raw(handle)
    with pytest.raises(UpstreamError) as failure:
        await client.request(worker.url, "GET", "/", [])
    assert failure.value.reason == "bad_response"


async def test_a_pause_that_outlives_the_response_does_not_stall_the_pool(start_raw):
    gate = asyncio.Event()

    async def handle(worker, reader, writer) -> None:
        while await worker.read_request(reader):
            writer.write(OK_HEAD)
            await gate.wait()  # then the whole body in one write
            writer.write(chunk(b"one") + chunk(b"two") + b"0\r\n\r\n")

    worker = await start_raw(handle)
    client = UpstreamClient(read_timeout=0.3)
    try:
        response = await client.request(worker.url, "GET", "/s", [])
        received: list[bytes] = []

        def sink(data: bytes) -> None:  # a client that is slow: flow control pauses
            received.append(data)
            response.pause_reading()

        relayed = response.relay(sink)
        gate.set()
        await asyncio.wait_for(relayed, TIMEOUT)
        assert received == [b"one", b"two"]
        # The stream ended while paused (nobody resumes it); the pooled connection
        # must still read the next response.
        again = await client.request(worker.url, "GET", "/s", [])
        assert await asyncio.wait_for(again.read(), 2.5) == b"onetwo"
        assert worker.num_connections == 1
    finally:
        await client.close()


async def test_idle_connections_close_after_idle_timeout_without_new_requests(start_raw):
    closed = asyncio.Event()

    async def handle(worker, reader, writer) -> None:
        while await worker.read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        closed.set()  # EOF: the client closed its idle connection

    worker = await start_raw(handle)
    client = UpstreamClient(read_timeout=None, idle_timeout=0.2)
    try:
        assert await (await client.request(worker.url, "GET", "/", [])).read() == b"ok"
        assert len(client.idle[worker.url]) == 1
        await asyncio.wait_for(closed.wait(), 3.0)  # the sweeper ticks every second
        assert client.idle[worker.url] == []
    finally:
        await client.close()
