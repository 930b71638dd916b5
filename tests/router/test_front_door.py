"""What one client can make the router's HTTP server hold (`frota.router.server`): unsent
bytes, requests read ahead of their turn, connections; over real sockets, in this
process (test_front_door_process.py runs `frota router`, on uvloop)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest

from frota.router.server import (
    MAX_PIPELINED_BODY_BYTES,
    WRITE_BUFFER_HIGH,
    HttpServer,
    Limits,
    Request,
    Response,
    open_stream,
)
from tests.router.test_server import (
    GET,
    TIMEOUT,
    assert_closed,
    assert_openai_error,
    connect,  # noqa: F401 (a fixture)
    read_response,
    serve,  # noqa: F401 (a fixture)
)

ANSWER = bytes(range(256)) * 1024  # 256 KiB: more than a transport holds before it pauses


async def wait_for(predicate, timeout: float = TIMEOUT) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


async def non_reading_socket(port: int) -> socket.socket:
    """A client socket whose kernel takes little of what the server sends: what the
    test does not read stays in the server."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


@pytest.fixture
async def sockets() -> AsyncIterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def small_send_buffer(request: Request) -> None:
    """Shrink the server's kernel send buffer for this connection, so that what the
    client leaves unread stays in the transport rather than in the kernel."""
    sock = request._conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)


async def test_a_client_that_does_not_read_is_not_read_and_its_unsent_bytes_stay_bounded(
        serve, connect, sockets):  # noqa: F811
    # A client pipelines 64 requests for 256 KiB answers and reads none: the server answers
    # until one answer is unsent, stops reading and answering, and goes on once the client
    # reads, answering every request in order.
    served: list[str] = []

    async def handler(request: Request) -> Response:
        small_send_buffer(request)
        served.append(request.path)
        return Response(200, ANSWER)

    server, port = await serve(handler)
    sock = await non_reading_socket(port)
    sockets.append(sock)
    loop = asyncio.get_running_loop()
    requests = b"".join(b"GET /%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(64))
    sending = asyncio.create_task(loop.sock_sendall(sock, requests))
    await wait_for(lambda: len(server.connections) == 1 and served)
    (conn,) = server.connections
    await wait_for(lambda: conn.writing_paused)
    await asyncio.sleep(0.3)  # time it would have to answer more, were it reading
    num_served = len(served)
    assert num_served <= 2  # the one whose answer paused writing, at most one before it
    assert not conn.transport.is_reading()
    assert conn.transport.get_write_buffer_size() <= WRITE_BUFFER_HIGH + len(ANSWER) + 1024
    await asyncio.sleep(0.3)
    assert len(served) == num_served  # nothing more while the client reads nothing
    reader, _ = await connect(port, sock=sock)
    for i in range(64):
        response = await read_response(reader)
        assert response.status == 200 and response.body == ANSWER, i
    assert served == [f"/{i}" for i in range(64)]
    await asyncio.wait_for(sending, TIMEOUT)


@pytest.mark.parametrize("answer", ["whole", "close", "stream"])
async def test_a_client_that_takes_nothing_for_write_timeout_is_cut_off(
        serve, sockets, answer):  # noqa: F811
    # Whole answers over the high-water mark pause writing; a short answer after
    # `Connection: close` stays unsent in a closing transport; a stream pauses its source.
    # In each case the connection is aborted after write_timeout, and a stream's handler
    # is cancelled (which frees its worker).
    cancelled = asyncio.Event()

    async def handler(request: Request) -> Response | object:
        small_send_buffer(request)
        if answer == "close":
            return Response(200, ANSWER[:40 * 1024])  # under the high-water mark
        if answer == "whole":
            return Response(200, ANSWER)
        stream = open_stream(request, 200, [], b"first")
        try:
            while True:
                stream.write(ANSWER[:4096])
                await asyncio.sleep(0.001)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server, port = await serve(handler, write_timeout=0.5, keepalive_timeout=30.0)
    sock = await non_reading_socket(port)
    sockets.append(sock)
    close = b"Connection: close\r\n" if answer == "close" else b""
    await asyncio.get_running_loop().sock_sendall(
        sock, b"GET / HTTP/1.1\r\nHost: t\r\n" + close + b"\r\n")
    await wait_for(lambda: server.connections)
    (conn,) = server.connections
    await wait_for(lambda: not server.connections)  # well before keepalive_timeout
    assert conn.transport is None
    if answer == "close":  # closed with bytes unsent, not after sending them all
        assert conn.closing_since is not None and not conn.writing_paused
    if answer == "stream":
        assert cancelled.is_set()


async def test_connections_over_max_connections_get_503_with_retry_after_and_are_closed(
        serve, connect):  # noqa: F811
    handled: list[str] = []

    async def handler(request: Request) -> Response:
        handled.append(request.path)
        return Response(200, b"ok")

    server, port = await serve(handler, max_connections=2)
    kept = []
    for _ in range(2):
        reader, writer = await connect(port)
        writer.write(GET)
        assert (await read_response(reader)).status == 200
        kept.append((reader, writer))
    # The third is answered before it is read: its request (with a body the server never
    # reads) does not turn the close into a reset that would destroy the 503.
    reader, writer = await connect(port)
    writer.write(b"POST /over HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n"
                 + b"b" * 200_000)
    response = await read_response(reader)
    error = assert_openai_error(response, 503, "too_many_connections")
    assert error["type"] == "service_unavailable"
    assert response.headers["retry-after"] == "1"
    assert response.headers["connection"] == "close"
    await assert_closed(reader)
    writer.close()  # which lets the server close its side at once, not after the linger
    assert "/over" not in handled and len(server.connections) == 2
    for reader, writer in kept:  # the connections within the cap are served on
        writer.write(GET)
        assert (await read_response(reader)).status == 200
    kept[0][1].close()
    await wait_for(lambda: len(server.connections) == 1)
    reader, writer = await connect(port)  # a place is free again
    writer.write(b"GET /again HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await read_response(reader)).status == 200
    assert handled[-1] == "/again"
    await wait_for(lambda: not server.turned_away, timeout=1.0)


async def test_a_turned_away_client_that_never_closes_is_let_go_after_the_linger(
        serve, connect, monkeypatch):  # noqa: F811
    monkeypatch.setattr("frota.router.server.TURN_AWAY_LINGER", 0.3)
    server, port = await serve(lambda request: asyncio.sleep(0, Response(200)),
                               max_connections=1, keepalive_timeout=1.0)
    await connect(port)
    await wait_for(lambda: len(server.connections) == 1)
    reader, writer = await connect(port)
    assert (await read_response(reader)).status == 503
    assert len(server.turned_away) == 1
    writer.write(b"x" * 1000)  # discarded, and does not keep it open
    await wait_for(lambda: not server.turned_away, timeout=3.0)


async def test_pipelined_bodies_over_the_bound_stop_reading_until_answered(serve, connect):  # noqa: F811
    # Three pipelined requests with bodies of 0.6 MiB each: once the first two are held
    # (over MAX_PIPELINED_BODY_BYTES), the third is not read until the first is answered.
    gate = asyncio.Event()
    bodies: list[int] = []

    async def handler(request: Request) -> Response:
        bodies.append(len(request.body))
        await gate.wait()
        return Response(200, b"%d" % len(request.body))

    server, port = await serve(handler)
    size = MAX_PIPELINED_BODY_BYTES * 6 // 10
    reader, writer = await connect(port)
    request = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%b" % (size, b"x" * size)
    writer.write(request * 3)
    await wait_for(lambda: server.connections)
    (conn,) = server.connections
    await wait_for(lambda: len(conn.queue) >= 2 and conn.queue[1].complete)
    await asyncio.sleep(0.3)
    assert not conn.transport.is_reading()
    assert len(conn.queue) == 2 or not conn.queue[2].complete
    gate.set()
    for _ in range(3):
        response = await read_response(reader)
        assert response.status == 200 and response.body == b"%d" % size
    assert bodies == [size] * 3


def test_limits_that_would_disable_themselves_are_refused():
    async def handler(request: Request) -> Response:
        return Response(200)

    for limits in ({"max_connections": 0}, {"write_timeout": 0}, {"keepalive_timeout": -1}):
        with pytest.raises(ValueError):
            HttpServer(handler, Limits(**limits))  # type: ignore[arg-type]


async def test_a_slow_client_that_keeps_reading_gets_every_answer(serve, connect, sockets):  # noqa: F811
    # Writing pauses and resumes many times over: each resume lets the next request in.
    async def handler(request: Request) -> Response:
        return Response(200, json.dumps({"path": request.path}).encode() + ANSWER)

    server, port = await serve(handler)
    sock = await non_reading_socket(port)
    sockets.append(sock)
    reader, writer = await connect(port, sock=sock)
    writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(20)))
    for i in range(20):
        response = await read_response(reader)
        assert response.body.startswith(b'{"path": "/%d"}' % i)
        await asyncio.sleep(0.01)
    assert len(server.connections) == 1



def test_front_door_flags_default_to_the_servers_limits_and_refuse_disabling_values():
    import argparse

    from frota.router import cli
    from frota.router.app import RouterConfig
    from frota.router.server import KEEPALIVE_TIMEOUT, MAX_CONNECTIONS, WRITE_TIMEOUT

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        return parser.parse_args(["--workers", "http://w:1", *argv])

    limits = cli.config_from_args(parse()).limits
    assert (limits.max_connections, limits.keepalive_timeout, limits.write_timeout) == (
        MAX_CONNECTIONS, KEEPALIVE_TIMEOUT, WRITE_TIMEOUT)
    assert limits == RouterConfig().limits
    limits = cli.config_from_args(parse("--max-connections", "10", "--keepalive-timeout",
                                        "5", "--write-timeout", "7.5")).limits
    assert (limits.max_connections, limits.keepalive_timeout, limits.write_timeout) == (
        10, 5.0, 7.5)
    for flag, value in (("--max-connections", "0"), ("--write-timeout", "0"),
                        ("--keepalive-timeout", "-1")):
        with pytest.raises(ValueError, match=flag.strip("-").replace("-", "_")):
            cli.config_from_args(parse(flag, value))
