"""The front door's bounds on a real `frota router` process (on uvloop, as deployed), over
real sockets, before a stand-in worker in this process that answers fixed OpenAI-shaped
JSON: a client that pipelines and never reads leaves the router's memory flat while
others are served, and the connection flags reach the server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from frota.router.server import HttpServer, Request, Response
from tests.processes import ServingProcess, free_port, frota_argv
from tests.router.test_server import read_response

pytestmark = pytest.mark.slow

# Whole answers this big (128 KiB) make a buffer that grows per answer show within
# seconds: the router before bounded writes (d94d453) grew by 390 MiB in DURATION_S, with
# the ordinary clients thinking THINK_S between requests, and by 0 MiB after.
ANSWER = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "fake",
                     "choices": [{"index": 0, "text": "tok " * 32 * 1024,
                                  "finish_reason": "length"}]}).encode()
DURATION_S = 4.0
WARMUP_S = 1.5
NUM_CLIENTS = 50
THINK_S = 0.1  # between an ordinary client's answer and its next request
MAX_RSS_GROWTH_MIB = 50
BODY = b'{"model": "fake", "prompt": "hello", "max_tokens": 32}'
REQUEST = (b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY))


async def stand_in(request: Request) -> Response:
    if request.path == "/v1/completions":
        return Response(200, ANSWER, [("Content-Type", "application/json")])
    if request.path == "/ready":
        return Response(200, b'{"status": "ready"}', [("Content-Type", "application/json")])
    return Response(404, b"{}", [("Content-Type", "application/json")])


@pytest.fixture
async def worker_url() -> AsyncIterator[str]:
    server = HttpServer(stand_in)
    port = await server.listen("127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}"
    await server.close(grace=0.5)


@pytest.fixture
async def start_router(tmp_path: Path) -> AsyncIterator:  # type: ignore[type-arg]
    started: list[ServingProcess] = []

    async def start(worker_url: str, *flags: str) -> ServingProcess:
        port = free_port()
        argv = frota_argv("router", "--workers", worker_url, "--probe-interval", "0.2",
                          *flags, port=port)
        router = ServingProcess(f"router-{port}", argv, port, tmp_path / f"router-{port}.log")
        started.append(router)
        return await router.wait_ready_async(60)

    yield start
    for router in started:
        await asyncio.to_thread(router.stop)


async def client(port: int, until: float, answers: list[float], failures: list[str]) -> None:
    """An ordinary client: one request at a time on a kept-alive connection, each answer
    read whole, THINK_S apart, until `until` (the loop's time)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while loop.time() < until:
            writer.write(REQUEST)
            response = await read_response(reader)
            if response.status != 200 or response.body != ANSWER:
                failures.append(f"{response.status} {response.body[:200]!r}")
                return
            answers.append(loop.time())
            await asyncio.sleep(THINK_S)
    except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
        failures.append(repr(exc))
    finally:
        writer.close()


async def pipeline_without_reading(port: int) -> None:
    """Send requests back to back, never reading an answer (a receive buffer kept small,
    so that what is unread stays with the router)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        burst = REQUEST * 16
        while True:
            await loop.sock_sendall(sock, burst)
    finally:
        sock.close()


async def test_a_client_that_pipelines_and_never_reads_leaves_rss_flat_and_others_served(
        worker_url, start_router):
    router = await start_router(worker_url)
    process = psutil.Process(router.popen.pid)
    loop = asyncio.get_running_loop()
    rss_mib: list[float] = []

    async def sample_rss(until: float) -> None:
        while loop.time() < until:
            rss_mib.append(process.memory_info().rss / 2**20)
            await asyncio.sleep(0.1)

    answers: list[list[float]] = [[] for _ in range(NUM_CLIENTS)]  # when, per client
    failures: list[str] = []
    start = loop.time()
    end = start + WARMUP_S + DURATION_S
    clients = [asyncio.create_task(client(router.port, end, times, failures))
               for times in answers]
    await sample_rss(start + WARMUP_S)  # the router under the ordinary clients' load alone
    baseline = max(rss_mib)
    pipelining_since = loop.time()
    pipelining = asyncio.create_task(pipeline_without_reading(router.port))
    await sample_rss(end)
    pipelining.cancel()
    await asyncio.gather(*clients)
    growth = max(rss_mib) - baseline
    assert growth < MAX_RSS_GROWTH_MIB, (
        f"the router's RSS grew by {growth:.0f} MiB (from {baseline:.0f}) while a client "
        f"pipelined without reading; samples: {[round(r) for r in rss_mib]}")
    assert failures == []
    # Every ordinary client was served on while the other client pipelined.
    assert all(times and times[-1] > pipelining_since for times in answers)
    assert process.is_running()


async def test_router_flags_cap_connections_and_close_idle_ones(worker_url, start_router):
    router = await start_router(worker_url, "--max-connections", "2",
                                "--keepalive-timeout", "1", "--write-timeout", "5")
    # The readiness probe's connection may still be closing: wait for both places.
    held = []
    for _ in range(50):
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        writer.write(REQUEST)
        response = await read_response(reader)
        if response.status == 200:
            held.append((reader, writer))
            if len(held) == 2:
                break
        await asyncio.sleep(0.05)
    assert len(held) == 2
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(REQUEST)
    response = await read_response(reader)
    assert response.status == 503 and response.headers["retry-after"] == "1"
    assert json.loads(response.body)["error"]["code"] == "too_many_connections"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    # --keepalive-timeout: the two held connections, idle, are closed after about 1 s.
    for reader, writer in held:
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(REQUEST)
    assert (await read_response(reader)).status == 200
    writer.close()
