"""The router's HTTP server (`frota.router.server`), byte by byte over real sockets."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from frota.router.errors import json_response
from frota.router.server import Answer, HttpServer, Limits, Request, Response, open_stream

TIMEOUT = 5.0
GET = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


@dataclass
class RawResponse:
    status_line: str
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """One response off the wire: Content-Length, chunked, or until the close."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"repeated header {name}"
            headers[name.lower()] = value.strip()
    if int(status_line.split()[1]) in (204, 304):
        body = b""
    elif "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), TIMEOUT)
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int(await asyncio.wait_for(reader.readuntil(b"\r\n"), TIMEOUT), 16)
            data = await asyncio.wait_for(reader.readexactly(size + 2), TIMEOUT)
            assert data.endswith(b"\r\n")
            if size == 0:
                break
            parts.append(data[:-2])
        body = b"".join(parts)
    else:
        body = await asyncio.wait_for(reader.read(), TIMEOUT)
    return RawResponse(status_line, int(status_line.split()[1]), headers, body)


async def assert_closed(reader: asyncio.StreamReader) -> None:
    """The server closed the connection (and sent nothing more)."""
    try:
        rest = await asyncio.wait_for(reader.read(), TIMEOUT)
    except ConnectionResetError:
        return
    assert rest == b""


def assert_openai_error(response: RawResponse, status: int, code: str) -> dict:
    assert response.status == status
    assert response.headers["content-type"].startswith("application/json")
    body = json.loads(response.body)
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and isinstance(error["message"], str) and error["message"]
    return error


async def echo(request: Request) -> Response:
    return json_response({"method": request.method, "target": request.target,
                          "body": request.body.decode("latin-1"),
                          "version": request.http_version,
                          "headers": {k.lower(): v for k, v in request.headers.items()}})


async def small_buffer_socket(port: int) -> socket.socket:
    """A client socket that takes little from the server before the test reads it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


Serve = Callable[..., Awaitable[tuple[HttpServer, int]]]
Connect = Callable[..., Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[HttpServer] = []

    async def start(handler: Callable[[Request], Awaitable[Answer]],
                    **limits: object) -> tuple[HttpServer, int]:
        server = HttpServer(handler, Limits(**limits))  # type: ignore[arg-type]
        servers.append(server)
        return server, await server.listen("127.0.0.1", 0)

    yield start
    for server in servers:
        await server.close(grace=0.1)


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    writers: list[asyncio.StreamWriter] = []

    async def open_(port: int, sock: socket.socket | None = None
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if sock is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            reader, writer = await asyncio.open_connection(sock=sock)
        writers.append(writer)
        return reader, writer

    yield open_
    for writer in writers:
        writer.close()



def text(status: int, body: bytes = b"") -> Response:
    return Response(status, body)


@dataclass
class Recorder:
    """A handler that keeps each request it is given and answers `status` with `body`."""

    status: int = 200
    body: bytes = b""
    requests: list[Request] = field(default_factory=list)

    async def __call__(self, request: Request) -> Response:
        self.requests.append(request)
        return text(self.status, self.body)


async def test_keep_alive_serves_two_requests_on_one_connection(serve, connect):
    server, port = await serve(echo)
    reader, writer = await connect(port)
    for target in ("/one", "/two?x=1"):
        writer.write(f"GET {target} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        response = await read_response(reader)
        assert response.status_line == "HTTP/1.1 200 OK"
        assert "connection" not in response.headers
        assert json.loads(response.body)["target"] == target
    assert len(server.connections) == 1
    # HTTP/1.1 with `Connection: close` is answered, then closed.
    writer.write(b"GET /three HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    response = await read_response(reader)
    assert response.status == 200 and response.headers["connection"] == "close"
    await assert_closed(reader)


async def test_a_request_is_parsed_into_its_parts(serve, connect):
    handler = Recorder(204)
    _, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(b"PUT /v1/x?a=1&b=%2F HTTP/1.1\r\nHost: t\r\nX-Tag: one\r\nx-tag: two\r\n"
                 b"Content-Length: 4\r\n\r\nbody")
    response = await read_response(reader)
    assert response.status_line == "HTTP/1.1 204 No Content"
    (request,) = handler.requests
    assert (request.method, request.target, request.path) == ("PUT", "/v1/x?a=1&b=%2F", "/v1/x")
    assert request.headers["x-tag"] == "one"  # case-insensitive; a repeated header: the first
    assert request.headers.getall("X-TAG") == ["one", "two"]
    assert ("X-Tag", "one") in request.raw_headers and ("x-tag", "two") in request.raw_headers
    assert request.body == b"body" and request.http_version == "1.1"


# Requests of every framing, pipelined: a head with a body of known length, one with none,
# a chunked body (which the slow parser reads), blank lines before a request, a repeated
# header. (request, what `echo` should see: target, body, a header).
MIXED = [
    (b"POST /a HTTP/1.1\r\nHost: t\r\nX-Tag: a\r\nContent-Length: 5\r\n\r\nhello",
     "/a", "hello", "a"),
    (b"GET /b HTTP/1.1\r\nHost: t\r\nX-Tag: b\r\nx-tag: second\r\n\r\n", "/b", "", "b"),
    (b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nX-Tag: c\r\n\r\n"
     b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "/c", "abcde", "c"),
    (b"\r\nGET /d HTTP/1.1\r\nHost: t\r\nX-Tag: d\r\n\r\n", "/d", "", "d"),
    (b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nX-Tag: e\r\n\r\nxyz", "/e", "xyz", "e"),
]


@pytest.mark.parametrize("cut", [1, 7, 40, "request", "request-tail", "whole"])
async def test_pipelined_requests_come_out_the_same_however_the_bytes_are_cut(
        serve, connect, cut):
    # A head whole in one read goes to the fast parser, the rest to the slow one: any cut,
    # mid-head, mid-body or between requests, gives the same requests in the same order.
    server, port = await serve(echo)
    reader, writer = await connect(port)
    requests = [request for request, *_ in MIXED] * 2
    data = b"".join(requests)
    if cut == "whole":
        pieces = [data]
    elif cut == "request":  # each in a read of its own: fast, fast, slow, slow, fast, ...
        pieces = requests
    elif cut == "request-tail":  # its last two bytes apart: a body that ends a read later
        pieces = [part for request in requests for part in (request[:-2], request[-2:])]
    else:
        pieces = [data[i:i + cut] for i in range(0, len(data), cut)]
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0.001)  # separate reads, mostly
    for _, target, body, tag in MIXED * 2:
        answer = json.loads((await read_response(reader)).body)
        assert (answer["target"], answer["body"], answer["headers"]["x-tag"]) == (
            target, body, tag)
    (conn,) = server.connections
    assert not conn.slow_reading  # between requests, the next head may go the fast way


async def test_a_compressed_body_passes_through_as_sent(serve, connect):
    _, port = await serve(echo)
    reader, writer = await connect(port)
    body = gzip.compress(b"{}")
    writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Encoding: gzip\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    response = await read_response(reader)
    assert json.loads(response.body)["body"] == body.decode("latin-1")


async def test_pipelined_requests_are_answered_in_order(serve, connect):
    events: list[str] = []

    async def handler(request: Request) -> Response:
        events.append(f"start {request.path}")
        await asyncio.sleep({"/slow": 0.2, "/mid": 0.05}.get(request.path, 0.0))
        events.append(f"end {request.path}")
        return text(200, request.path.encode())

    _, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n"
                 b"POST /fast HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
                 b"GET /mid HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    bodies = [(await read_response(reader)).body for _ in range(3)]
    assert bodies == [b"/slow", b"/fast", b"/mid"]
    # One request at a time: the next starts only once the one before it is answered.
    assert events == ["start /slow", "end /slow", "start /fast", "end /fast",
                      "start /mid", "end /mid"]
    await assert_closed(reader)


async def test_http10_request_is_answered_then_closed(serve, connect):
    _, port = await serve(echo)
    reader, writer = await connect(port)
    writer.write(b"GET /old HTTP/1.0\r\n\r\n")
    response = await read_response(reader)
    assert response.status == 200
    assert json.loads(response.body)["version"] == "1.0"
    await assert_closed(reader)


async def stream_in_two(request: Request, first: bytes, between: Callable[[], Awaitable[object]],
                        last: bytes, headers: list[tuple[str, str]] | None = None,
                        ) -> Answer:
    """Answer with a 200 stream: `first`, then (once `between()` is done) `last`, and end."""
    stream = open_stream(request, 200, headers or [], first)
    await between()
    stream.write(last)
    stream.end()
    return stream


async def test_streamed_response_to_http10_is_unchunked_and_ends_with_close(serve, connect):
    async def handler(request: Request) -> Answer:
        return await stream_in_two(request, b"one ", lambda: asyncio.sleep(0.01), b"two",
                                   [("Content-Type", "text/event-stream")])

    _, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(b"POST /v1/completions HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
    response = await read_response(reader)  # no length, not chunked: read until the close
    assert response.status == 200
    assert "transfer-encoding" not in response.headers
    assert "content-length" not in response.headers
    assert response.body == b"one two"


async def test_stream_chunks_decode_with_aiohttp(serve):
    gate = asyncio.Event()

    async def handler(request: Request) -> Answer:
        stream = open_stream(request, 201, [("Content-Type", "text/event-stream")],
                                   b"data: first\n\n")
        stream.write(b"")  # nothing to send: must not end the chunked body
        await gate.wait()
        stream.write(b"data: second\n\n")
        stream.write(b"x" * 70000)
        stream.end()
        stream.end()  # twice is harmless
        return stream

    _, port = await serve(handler)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/s") as resp:
            assert resp.status == 201
            assert resp.headers["Transfer-Encoding"] == "chunked"
            # The first chunk went out with the head, before the handler goes on.
            first = await asyncio.wait_for(resp.content.readany(), TIMEOUT)
            assert first == b"data: first\n\n"
            gate.set()
            rest = await asyncio.wait_for(resp.read(), TIMEOUT)
        assert rest == b"data: second\n\n" + b"x" * 70000
        async with session.get(f"http://127.0.0.1:{port}/s") as resp:  # connection reused
            assert await asyncio.wait_for(resp.read(), TIMEOUT) == (
                b"data: first\n\ndata: second\n\n" + b"x" * 70000)


async def test_a_stream_the_handler_left_open_is_ended_and_the_connection_reused(serve,
                                                                                   connect):
    async def handler(request: Request) -> Answer:
        stream = open_stream(request, 200, [], b"abc")
        if request.path == "/more":
            stream.write(b"def")
        return stream  # not ended

    _, port = await serve(handler)
    reader, writer = await connect(port)
    for path, body in (("/first", b"abc"), ("/more", b"abcdef")):
        writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        response = await read_response(reader)
        assert response.status == 200 and response.body == body
        assert response.headers["transfer-encoding"] == "chunked"


async def test_malformed_request_gets_400_in_the_openai_shape_and_close(serve, connect):
    handler = Recorder()
    _, port = await serve(handler)
    for bad in (b"GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n",
                b"GET /x?q=\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n",  # raw bytes: percent-encode
                b"GET / HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
                # A length that is not one (int() would take the first three), two
                # lengths, a length and chunks:
                b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: +2\r\n\r\nab",
                b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1_0\r\n\r\nab",
                b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: \xb2\r\n\r\nab",
                b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
                b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):  # TLS on the plain port
        reader, writer = await connect(port)
        writer.write(bad)
        response = await read_response(reader)
        error = assert_openai_error(response, 400, "bad_request")
        assert error["type"] == "invalid_request_error" and error["param"] is None
        assert "malformed" in error["message"]
        assert response.headers["connection"] == "close"
        await assert_closed(reader)
    assert handler.requests == []


# Framings that one parser may read differently from another, so that a request hides
# inside another's head or body (request smuggling), each refused with llhttp's 400 before
# any handler runs. The httptools floor in pyproject.toml is the first release whose
# llhttp refuses every one: 0.6.2's (llhttp 8.1.1) accepted obs-fold, an empty header
# name, a head ended by CR LF CR, and chunk data not followed by CRLF.
_POST = b"POST / HTTP/1.1\r\nHost: t\r\n"
_CHUNKED_HEAD = _POST + b"Transfer-Encoding: chunked\r\n\r\n"
SMUGGLING = {
    "content-length-and-chunked": _POST + b"Content-Length: 2\r\nTransfer-Encoding: chunked"
                                  b"\r\n\r\n2\r\nab\r\n0\r\n\r\n",
    "chunked-and-content-length": _POST + b"Transfer-Encoding: chunked\r\nContent-Length: 2"
                                  b"\r\n\r\n2\r\nab\r\n0\r\n\r\n",
    "same-content-length-twice": _POST + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nab",
    "content-length-list": _POST + b"Content-Length: 2, 2\r\n\r\nab",
    "space-before-colon": _POST + b"Content-Length : 2\r\n\r\nab",
    "space-before-first-header": b"POST / HTTP/1.1\r\n Content-Length: 2\r\nHost: t\r\n\r\nab",
    "obs-fold": _POST + b"X-A: a\r\n Content-Length: 2\r\n\r\nab",
    "obs-fold-transfer-encoding": _POST + b"Transfer-Encoding: identity\r\n chunked\r\n\r\n"
                                  b"2\r\nab\r\n0\r\n\r\n",
    "chunked-not-last": _POST + b"Transfer-Encoding: chunked, identity\r\n\r\n"
                        b"2\r\nab\r\n0\r\n\r\n",
    "transfer-encoding-not-chunked": _POST + b"Transfer-Encoding: identity\r\n\r\nab",
    "two-transfer-encodings": _POST + b"Transfer-Encoding: chunked\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
    "bare-lf-in-header": _POST + b"X-A: a\nContent-Length: 2\r\n\r\nab",
    "bare-lf-line-ends": b"POST / HTTP/1.1\nHost: t\nContent-Length: 2\n\nab",
    "bare-cr-in-header": _POST + b"X-A: a\rContent-Length: 2\r\n\r\nab",
    "head-ended-by-cr-lf-cr": _POST + b"X-A: a\r\n\rGET /smuggled HTTP/1.1\r\n\r\n",
    "empty-header-name": _POST + b": x\r\nContent-Length: 0\r\n\r\n",
    "nul-in-header-value": _POST + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
    "chunk-size-overflow": _CHUNKED_HEAD + b"10000000000000002\r\nab\r\n0\r\n\r\n",
    "chunk-size-0x": _CHUNKED_HEAD + b"0x2\r\nab\r\n0\r\n\r\n",
    "chunk-size-negative": _CHUNKED_HEAD + b"-2\r\nab\r\n0\r\n\r\n",
    "chunk-size-space": _CHUNKED_HEAD + b"2 \r\nab\r\n0\r\n\r\n",
    "chunk-size-bare-lf": _CHUNKED_HEAD + b"2\nab\r\n0\r\n\r\n",
    "chunk-data-without-crlf": _CHUNKED_HEAD + b"2\r\nabXX0\r\n\r\n",
    "chunk-extension-bare-lf": _CHUNKED_HEAD + b"2;a\nb\r\nab\r\n0\r\n\r\n",
    "chunk-extension-control-char": _CHUNKED_HEAD + b"2;a=\x01\r\nab\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", SMUGGLING.values(), ids=SMUGGLING.keys())
async def test_ambiguous_framing_gets_400_and_close_before_any_handler(serve, connect,
                                                                       request_bytes):
    handler = Recorder()
    _, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(request_bytes)
    response = await read_response(reader)
    assert_openai_error(response, 400, "bad_request")
    assert response.headers["connection"] == "close"
    await assert_closed(reader)
    assert handler.requests == []


async def test_a_broken_chunked_body_gets_400(serve, connect):
    _, port = await serve(echo)
    reader, writer = await connect(port)
    writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"zz\r\nnot hex\r\n0\r\n\r\n")
    assert_openai_error(await read_response(reader), 400, "bad_request")
    await assert_closed(reader)


async def test_protocol_upgrade_gets_400_without_reaching_the_handler(serve, connect):
    handler = Recorder(200, b"served")
    _, port = await serve(handler)
    for request in (b"GET /chat HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\n\r\n",
                    b"GET /chat HTTP/1.1\r\nHost: t\r\nConnection: keep-alive, Upgrade\r\n"
                    b"Upgrade: h2c\r\n\r\n",
                    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"):
        reader, writer = await connect(port)
        writer.write(request)
        response = await read_response(reader)
        assert_openai_error(response, 400, "unsupported_upgrade")
        await assert_closed(reader)
    assert handler.requests == []


async def test_content_length_over_max_body_gets_413_before_the_body(serve, connect):
    _, port = await serve(echo, max_body=1000)
    reader, writer = await connect(port)
    writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n")  # no body yet
    response = await read_response(reader)
    assert_openai_error(response, 413, "request_too_large")
    assert response.headers["connection"] == "close"
    await assert_closed(reader)
    # At the limit is fine.
    reader, writer = await connect(port)
    writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"b" * 1000)
    response = await read_response(reader)
    assert response.status == 200 and json.loads(response.body)["body"] == "b" * 1000


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def test_chunked_body_over_max_body_gets_413(serve, connect):
    _, port = await serve(echo, max_body=100)
    head = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    reader, writer = await connect(port)
    writer.write(head + chunked(b"a" * 60, b"b" * 41))
    assert_openai_error(await read_response(reader), 413, "request_too_large")
    await assert_closed(reader)
    reader, writer = await connect(port)
    writer.write(head + chunked(b"a" * 60, b"b" * 40))  # 100 bytes: reassembled whole
    response = await read_response(reader)
    assert response.status == 200
    assert json.loads(response.body)["body"] == "a" * 60 + "b" * 40


async def test_headers_over_max_header_bytes_get_431(serve, connect):
    _, port = await serve(echo, max_header_bytes=1024)
    reader, writer = await connect(port)
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"v" * 1100 + b"\r\n\r\n")
    response = await read_response(reader)
    assert_openai_error(response, 431, "request_header_fields_too_large")
    await assert_closed(reader)
    # Many small headers add up too.
    reader, writer = await connect(port)
    many = b"".join(b"X-H%d: %b\r\n" % (i, b"v" * 60) for i in range(20))
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n" + many + b"\r\n")
    assert (await read_response(reader)).status == 431
    # So does the request line, even with no header after it.
    reader, writer = await connect(port)
    writer.write(b"GET /" + b"u" * 1100 + b" HTTP/1.0\r\n\r\n")
    assert (await read_response(reader)).status == 431
    reader, writer = await connect(port)
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"v" * 900 + b"\r\n\r\n")
    response = await read_response(reader)
    assert response.status == 200
    assert json.loads(response.body)["headers"]["x-big"] == "v" * 900


async def test_too_many_headers_get_431(serve, connect):
    _, port = await serve(echo)
    reader, writer = await connect(port)
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n" + many + b"\r\n")
    assert_openai_error(await read_response(reader), 431, "request_header_fields_too_large")
    await assert_closed(reader)


@pytest.mark.parametrize(("framing", "body"), [
    (b"Content-Length: 5", b"hello"),
    (b"Transfer-Encoding: chunked", chunked(b"hel", b"lo")),
], ids=["content-length", "chunked"])
async def test_expect_100_continue_is_answered_before_the_body(serve, connect, framing, body):
    _, port = await serve(echo)
    reader, writer = await connect(port)
    writer.write(b"POST /e HTTP/1.1\r\nHost: t\r\n" + framing + b"\r\n"
                 b"Expect: 100-continue\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    response = await read_response(reader)
    assert response.status == 200 and json.loads(response.body)["body"] == "hello"


async def test_a_handler_that_raises_gets_500_and_the_server_goes_on(serve, connect):
    async def handler(request: Request) -> Response:
        if request.path == "/boom":
            raise RuntimeError("handler bug")
        return text(200, b"fine")

    _, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n")
    error = assert_openai_error(await read_response(reader), 500, "internal_error")
    assert error["type"] == "internal_error"
    assert "handler bug" not in error["message"]  # no internals leak to the client
    writer.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")  # the same connection still works
    assert (await read_response(reader)).body == b"fine"
    reader, writer = await connect(port)  # and so do new ones
    writer.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await read_response(reader)).body == b"fine"


async def test_a_stream_whose_handler_raises_is_cut_off_not_answered_twice(serve, connect):
    async def handler(request: Request) -> Answer:
        if request.path == "/ok":
            return text(200, b"fine")
        stream = open_stream(request, 200, [], b"partial")
        stream.write(b"more")
        raise RuntimeError("handler bug mid-stream")

    _, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(GET)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert head.startswith(b"HTTP/1.1 200 OK")
    rest = await asyncio.wait_for(reader.read(), TIMEOUT)  # until the close
    assert rest == b"7\r\npartial\r\n4\r\nmore\r\n"  # no final chunk, no second answer
    reader, writer = await connect(port)
    writer.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await read_response(reader)).body == b"fine"


@dataclass
class Stalling:
    """A handler that waits 30 s, noting when it started and when it was cancelled."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    gone: list[bool] = field(default_factory=list)  # request.client_gone when cancelled

    async def __call__(self, request: Request) -> Response:
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.gone.append(request.client_gone)
            self.cancelled.set()
            raise
        return text(200)


async def test_a_client_that_leaves_cancels_its_handler(serve, connect):
    handler = Stalling()
    started, cancelled, gone = handler.started, handler.cancelled, handler.gone
    server, port = await serve(handler)
    _, writer = await connect(port)
    writer.write(GET)
    await asyncio.wait_for(started.wait(), TIMEOUT)
    writer.close()
    await asyncio.wait_for(cancelled.wait(), TIMEOUT)
    assert gone == [True]
    for _ in range(100):
        if not server.connections:
            break
        await asyncio.sleep(0.01)
    assert not server.connections


async def test_a_slow_reader_pauses_the_stream_source_and_resumes_it(serve, connect):
    paused, resumed = asyncio.Event(), asyncio.Event()
    calls: list[str] = []
    sent = []

    def pause() -> None:
        calls.append("pause")
        paused.set()

    def resume() -> None:
        calls.append("resume")
        resumed.set()

    async def handler(request: Request) -> Answer:
        stream = open_stream(request, 200, [], b"START")
        stream.set_flow_control(pause, resume)
        chunk, num_bytes = b"x" * 65536, len(b"START")
        while not paused.is_set() and num_bytes < 256 * 1024 * 1024:
            stream.write(chunk)  # never waits: the source would go on without flow control
            num_bytes += len(chunk)
        sent.append(num_bytes)
        await resumed.wait()
        stream.write(b"END")
        stream.end()
        return stream

    server, port = await serve(handler)
    sock = await small_buffer_socket(port)
    await asyncio.get_running_loop().sock_sendall(sock, GET)  # and nothing reads it yet
    await asyncio.wait_for(paused.wait(), TIMEOUT)
    (conn,) = server.connections
    assert conn.transport.get_write_buffer_size() > 0
    await asyncio.sleep(0.2)  # the client still reads nothing: the source stays paused
    assert calls == ["pause"]
    reader, _ = await connect(port, sock=sock)
    response = await read_response(reader)
    await asyncio.wait_for(resumed.wait(), TIMEOUT)
    assert calls == ["pause", "resume"]
    assert len(response.body) == sent[0] + 3 and response.body.endswith(b"xEND")
    assert response.body.startswith(b"STARTx")


async def test_close_lets_a_request_in_flight_finish_and_says_the_connection_closes(
        serve, connect):
    started = asyncio.Event()

    async def handler(request: Request) -> Response:
        if request.path == "/slow":
            started.set()
            await asyncio.sleep(0.3)
        return text(200, b"done " + request.path.encode())

    server, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    closing = asyncio.create_task(server.close(grace=5.0))
    response = await read_response(reader)
    assert response.status == 200 and response.body == b"done /slow"
    # Said in the head, so the client sends nothing more on a connection about to close.
    assert response.headers["connection"] == "close"
    await assert_closed(reader)
    await asyncio.wait_for(closing, TIMEOUT)
    with pytest.raises(OSError):
        await connect(port)


async def test_close_answers_a_request_sent_on_a_kept_alive_connection_during_idle_grace(
        serve, connect):
    server, port = await serve(echo)
    reader, writer = await connect(port)
    writer.write(GET)
    assert "connection" not in (await read_response(reader)).headers  # promised keep-alive
    closing = asyncio.create_task(server.close(grace=5.0, idle_grace=1.0))
    await asyncio.sleep(0.2)  # the client has not seen the drain, and sends its next request
    writer.write(GET)
    response = await read_response(reader)
    assert response.status == 200 and response.headers["connection"] == "close"
    await assert_closed(reader)
    await asyncio.wait_for(closing, TIMEOUT)


async def test_close_closes_a_connection_idle_for_idle_grace(serve, connect):
    server, port = await serve(echo)
    reader, writer = await connect(port)
    writer.write(GET)
    assert (await read_response(reader)).status == 200
    loop = asyncio.get_running_loop()
    began = loop.time()
    # A grace far longer than the read's timeout: only the idle grace can close it in time.
    closing = asyncio.create_task(server.close(grace=60.0, idle_grace=0.3))
    await assert_closed(reader)
    assert loop.time() - began >= 0.25
    await asyncio.wait_for(closing, TIMEOUT)


async def test_a_stream_begun_before_close_leaves_its_connection_open_for_the_next_request(
        serve, connect):
    """Its head promised keep-alive before the drain began: the connection then gets the
    idle grace like any other, and the next request is answered with a close."""
    begun, finish = asyncio.Event(), asyncio.Event()

    async def held_open() -> None:
        begun.set()
        await finish.wait()

    async def handler(request: Request) -> Answer:
        if request.path != "/stream":
            return text(200, b"after")
        return await stream_in_two(request, b"first ", held_open, b"last")

    server, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.wait_for(begun.wait(), TIMEOUT)
    closing = asyncio.create_task(server.close(grace=5.0, idle_grace=1.0))
    await asyncio.sleep(0.1)
    finish.set()
    response = await read_response(reader)
    assert response.body == b"first last" and "connection" not in response.headers
    writer.write(GET)
    after = await read_response(reader)
    assert after.body == b"after" and after.headers["connection"] == "close"
    await assert_closed(reader)
    await asyncio.wait_for(closing, TIMEOUT)


async def test_close_lets_an_answer_finish_reaching_a_slow_client(serve, connect):
    started = asyncio.Event()
    body = bytes(range(256)) * (32 * 1024)  # 8 MiB: far more than the socket buffers hold

    async def handler(request: Request) -> Response:
        started.set()
        await asyncio.sleep(0.1)
        return text(200, body)

    server, port = await serve(handler)
    reader, writer = await connect(port, sock=await small_buffer_socket(port))
    writer.write(GET)
    await asyncio.wait_for(started.wait(), TIMEOUT)
    closing = asyncio.create_task(server.close(grace=5.0))
    await asyncio.sleep(0.3)  # the handler has answered; most of the answer is still queued
    assert not closing.done()
    response = await read_response(reader)
    assert response.body == body
    await asyncio.wait_for(closing, TIMEOUT)


async def test_close_cuts_off_a_request_that_outlasts_grace(serve, connect):
    handler = Stalling()
    started, cancelled = handler.started, handler.cancelled
    server, port = await serve(handler)
    reader, writer = await connect(port)
    writer.write(GET)
    await asyncio.wait_for(started.wait(), TIMEOUT)
    await asyncio.wait_for(server.close(grace=0.2), TIMEOUT)
    assert cancelled.is_set()
    await assert_closed(reader)


async def test_an_idle_connection_closes_after_keepalive_timeout(serve, connect):
    _, port = await serve(echo, keepalive_timeout=0.2)
    reader, writer = await connect(port)
    writer.write(GET)
    assert (await read_response(reader)).status == 200
    await assert_closed(reader)


async def test_a_head_that_stalls_is_closed_after_keepalive_timeout(serve, connect):
    _, port = await serve(echo, keepalive_timeout=0.3)
    reader, writer = await connect(port)
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")  # and never the rest
    await assert_closed(reader)


async def test_a_header_that_never_ends_is_cut_off_at_the_limit(serve, connect):
    # The parser bounds one header line by bytes received, so an endless header value
    # cannot grow without limit.
    _, port = await serve(echo, max_header_bytes=1024)
    reader, writer = await connect(port)
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Endless: ")
    for _ in range(4):
        writer.write(b"v" * 512)  # never the end of the line
        await writer.drain()
    response = await read_response(reader)
    assert_openai_error(response, 431, "request_header_fields_too_large")
    await assert_closed(reader)


async def test_a_request_that_stalls_halfway_is_closed_after_keepalive_timeout(serve, connect):
    handler = Recorder(200, b"late")
    _, port = await serve(handler, keepalive_timeout=0.3)
    reader, writer = await connect(port)
    writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nhalf")
    await assert_closed(reader)  # the other half never came: closed, nothing served
    assert handler.requests == []


async def test_http10_keep_alive_is_kept_alive_and_says_so(serve, connect):
    _, port = await serve(echo)
    reader, writer = await connect(port)
    for _ in range(2):
        writer.write(b"GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        response = await read_response(reader)
        assert response.status == 200 and response.headers["connection"] == "keep-alive"


async def test_reuse_port_lets_two_servers_listen_on_one_port(connect):
    first = HttpServer(echo)
    port = await first.listen("127.0.0.1", 0, reuse_port=True)
    try:
        with pytest.raises(OSError):  # without it, the port is taken
            await HttpServer(echo).listen("127.0.0.1", port)
        second = HttpServer(echo)
        assert await second.listen("127.0.0.1", port, reuse_port=True) == port
        await first.close(grace=0.1)  # the other one goes on serving the port
        reader, writer = await connect(port)
        writer.write(GET)
        assert (await read_response(reader)).status == 200
        await second.close(grace=0.1)
    finally:
        await first.close(grace=0.1)


async def test_a_long_pipelined_burst_is_answered_whole_and_in_order(serve, connect):
    # More requests than the connection queues before it stops reading: it reads on as
    # it answers them.
    _, port = await serve(echo)
    reader, writer = await connect(port)
    writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(50)))
    for i in range(50):
        assert json.loads((await read_response(reader)).body)["target"] == f"/{i}"
