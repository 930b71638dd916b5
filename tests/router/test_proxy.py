"""Proxying through a real router app to worker doubles: passthrough, retries, failures."""

import asyncio
import json
import socket

import aiohttp
import pytest

from frota.router.app import RouterConfig
from frota.router.proxy import ProxyConfig

STREAM = {"model": "fake", "prompt": "hello", "stream": True, "max_tokens": 5}


async def read_sse(resp: aiohttp.ClientResponse) -> list[str]:
    text = (await resp.read()).decode()
    return [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]


async def test_stream_passes_through_byte_for_byte(start_worker, start_router):
    worker = await start_worker(num_tokens=20)
    router = await start_router([worker])
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as direct_like:
        assert direct_like.status == 200
        assert direct_like.headers["Content-Type"].startswith("text/event-stream")
        via_router = await direct_like.read()
    async with router.session.post(worker.url + "/v1/completions", json=STREAM) as direct:
        assert via_router == await direct.read()
    assert via_router.endswith(b"data: [DONE]\n\n")


async def test_chunks_reach_the_client_before_the_stream_ends(start_worker, start_router):
    gate = asyncio.Event()
    # The worker sends one chunk, then waits for the gate: the client must see it meanwhile.
    worker = await start_worker(num_tokens=2, gate=gate, gate_at_chunk=1)
    router = await start_router([worker])
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as resp:
        first = await asyncio.wait_for(resp.content.readany(), 5)
        assert first.startswith(b"data: ") and b"t0" in first
        gate.set()
        rest = await resp.read()
        assert b"t1" in rest and rest.endswith(b"data: [DONE]\n\n")


async def test_a_client_that_reads_nothing_holds_the_worker_back(start_worker, start_router):
    num_tokens = 20000  # chunks of 4 KiB: 80 MiB, far more than socket buffers hold
    worker = await start_worker(num_tokens=num_tokens, chunk_padding=4096)
    router = await start_router([worker])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", router.app.port))
    body = json.dumps({**STREAM, "max_tokens": num_tokens}).encode()
    await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                            b"Content-Type: application/json\r\nConnection: close\r\n"
                            b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    await asyncio.sleep(0.5)
    held = worker.num_chunks_sent
    await asyncio.sleep(0.3)
    # The worker waits (what it sent so far is mostly in the kernel's socket buffers).
    assert worker.num_chunks_sent == held < num_tokens // 4
    reader, writer = await asyncio.open_connection(sock=sock)
    received = await asyncio.wait_for(reader.read(), 10)  # the router closes at the end
    writer.close()
    assert worker.num_chunks_sent == num_tokens
    assert received.count(b'"pad"') == num_tokens and b"data: [DONE]" in received


async def test_non_streaming_answers_are_forwarded_whole(start_worker, start_router):
    worker = await start_worker(name="solo")
    router = await start_router([worker])
    async with router.session.post(router.url + "/v1/chat/completions",
                                   json={"messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status == 200
        assert (await r.json())["worker"] == "solo"
        assert r.headers["x-frota-worker"] == worker.url
    async with router.session.get(router.url + "/v1/models") as r:
        assert (await r.json())["data"][0]["id"] == "fake"


async def test_request_body_reaches_the_worker_unchanged_with_the_routers_request_id(
        start_worker, start_router):
    worker = await start_worker()
    router = await start_router([worker])
    raw = b'{"prompt":"x",   "max_tokens":2, "extra_field":[1,2]}'
    async with router.session.post(router.url + "/v1/completions", data=raw,
                                   headers={"Content-Type": "application/json",
                                            "X-Request-Id": "abc"}) as r:
        assert r.status == 200
        answered_id = r.headers["x-request-id"]
    assert worker.raw_bodies == [raw]  # not re-serialized
    # The router names each request itself: a client's id is not passed on as the log's.
    assert worker.headers[0].getall("X-Request-Id") == [answered_id] != ["abc"]
    assert "Authorization" not in worker.headers[0]


async def test_a_worker_sees_only_the_allowed_header_lines_of_a_client_as_sent(
        start_worker, start_router):
    worker = await start_worker()
    router = await start_router([worker])
    reader, writer = await asyncio.open_connection("127.0.0.1", router.app.port)
    body = b'{"prompt": "x", "max_tokens": 2}'
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nX-Tag: one\r\n"
                 b"Connection: close\r\nAuthorization: Bearer secret\r\n"
                 b"Accept-Encoding: gzip\r\ntraceparent: 00-a-b-01\r\nUser-Agent:  Test/1 \r\n"
                 b"traceparent: 00-c-d-01\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    seen = worker.headers[0]
    assert seen.getall("traceparent") == ["00-a-b-01", "00-c-d-01"]  # both, in order
    assert seen["User-Agent"] == "Test/1"
    assert seen["Content-Type"] == "application/json"
    assert seen["Host"] == worker.url.removeprefix("http://")  # the worker's own
    assert seen.getall("Accept-Encoding") == ["identity"]  # the router's, not the client's
    assert seen.getall("Content-Length") == [str(len(body))]
    assert "Authorization" not in seen
    assert "X-Tag" not in seen  # not on the allowlist
    assert "Connection" not in seen  # the client's connection, not the worker's


async def test_a_workers_cookie_is_not_sent_to_the_next_request(start_worker, start_router):
    worker = await start_worker(set_cookie="affinity=w1; Path=/")
    worker.url = worker.url.replace("127.0.0.1", "localhost")  # a jar keeps no IP's cookies
    router = await start_router([worker])
    body = {"model": "fake", "prompt": "hi"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as client:
        for _ in range(2):
            async with client.post(router.url + "/v1/completions", json=body) as r:
                assert r.status == 200
                assert r.headers["Set-Cookie"].startswith("affinity=w1")  # passed on
    assert [h.get("Cookie") for h in worker.headers] == [None, None]


async def stream_events(router, num_requests: int) -> list[list[str]]:
    """Stream `num_requests` completions one after another, each answered 200: their events."""
    answers = []
    for _ in range(num_requests):
        async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
            assert r.status == 200
            answers.append(await read_sse(r))
    return answers


async def failing_then_good(start_worker, start_router, config: RouterConfig, **failure):
    """A router over a worker that fails as `failure` says and a healthy one named good."""
    failing = await start_worker(**failure)
    good = await start_worker(name="good")
    return failing, good, await start_router([failing, good], config)


async def test_a_503_worker_is_retried_on_another_and_ejected(start_worker, start_router):
    sick, good, router = await failing_then_good(
        start_worker, start_router, RouterConfig(probe_interval=30), answer_status=503)
    for events in await stream_events(router, 4):
        assert events[-1] == "[DONE]"
    assert len(sick.bodies) == 1  # ejected after its first 503
    assert len(good.bodies) == 4
    assert router.metric("frota_router_retries_total", reason="status_503") == 1


async def test_a_dead_worker_is_retried_before_the_first_byte(start_worker, start_router):
    dead, _, router = await failing_then_good(
        start_worker, start_router, RouterConfig(probe_interval=30, eject_after=2))
    await dead.server.close()
    for events in await stream_events(router, 6):
        assert events[-1] == "[DONE]" and '"good"' in events[0]
    # A refused connection (nothing listens) ejects at once, not after eject_after failures:
    # one request pays a retry, the rest go straight to the live worker.
    assert router.metric("frota_router_retries_total", reason="connect_error") == 1
    assert router.metric("frota_router_ejections_total", worker=dead.url) == 1


async def test_a_worker_dying_before_its_first_chunk_is_retried(start_worker, start_router):
    _, _, router = await failing_then_good(
        start_worker, start_router, RouterConfig(probe_interval=30), die_after_chunks=0)
    for events in await stream_events(router, 2):
        assert events[-1] == "[DONE]" and '"good"' in events[0]
    assert router.metric("frota_router_retries_total", reason="disconnected") >= 1


async def test_a_stream_broken_midway_ends_with_an_error_event(start_worker, start_router):
    worker = await start_worker(num_tokens=10, die_after_chunks=3)
    router = await start_router([worker])
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        assert r.status == 200
        events = await read_sse(r)
    assert len(events) == 5  # three tokens, the error, [DONE]
    error = json.loads(events[3])["error"]
    assert error["type"] == "upstream_error" and "incomplete" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert events[4] == "[DONE]"
    assert router.metric("frota_router_stream_errors_total") == 1


async def test_a_stream_broken_mid_chunk_is_cut_off(start_worker, start_router):
    # The worker's chunks go on as they come: part of one is already with the client when
    # the worker dies, so no error event can follow it. The client sees the stream cut.
    worker = await start_worker(num_tokens=10, token_delay=0.2, die_after_chunks=3,
                                die_mid_chunk=True)
    router = await start_router([worker])
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    assert router.metric("frota_router_stream_errors_total") == 1
    # The openai client raises (a connection error), after the whole chunks.
    import openai

    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    stream = await client.completions.create(model="fake", prompt="hi", stream=True)
    received = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk.choices[0].text)
    assert received == ["t0 ", "t1 ", "t2 "]
    await client.close()
    # The router goes on serving.
    healthy = await start_worker(num_tokens=2)
    router = await start_router([healthy])
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        assert (await read_sse(r))[-1] == "[DONE]"


async def test_inter_token_latency_is_each_gap_between_relayed_chunks(start_worker,
                                                                     start_router):
    delay = 0.03
    itl = "frota_router_inter_token_latency_seconds"
    worker = await start_worker(num_tokens=5, token_delay=delay)
    router = await start_router([worker])
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        events = await read_sse(r)
    assert len(events) == 6  # five tokens and [DONE]: five gaps after the first chunk
    assert router.metric(itl + "_count") == 5
    assert 5 * delay * 0.9 <= router.metric(itl + "_sum") < 5 * delay + 1.0
    assert router.metric(itl + "_bucket", le="0.01") == 0  # none shorter than the pause

    broken = await start_worker(num_tokens=10, token_delay=delay, die_after_chunks=3)
    router = await start_router([broken])
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        events = await read_sse(r)
    assert "error" in events[3]
    assert router.metric(itl + "_count") == 2  # the error event is not a token


async def test_retries_are_bounded(start_worker, start_router):
    workers = [await start_worker(answer_status=502) for _ in range(5)]
    config = RouterConfig(probe_interval=30, eject_after=100,
                          proxy=ProxyConfig(max_retries=2, retry_backoff=0.001))
    router = await start_router(workers, config)
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        assert r.status == 502
    assert sum(len(w.bodies) for w in workers) == 3


async def test_all_workers_full_passes_the_429_on(start_worker, start_router):
    workers = [await start_worker(answer_status=429) for _ in range(2)]
    router = await start_router(workers, RouterConfig(probe_interval=30))
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        assert r.status == 429 and r.headers["Retry-After"] == "1"
        assert "error" in await r.json()
    assert len(router.state.pool.healthy()) == 2  # a full queue is not a sick worker


async def test_client_disconnect_cancels_the_upstream_request(start_worker, start_router):
    worker = await start_worker(num_tokens=1000, token_delay=0.01)
    router = await start_router([worker])
    resp = await router.session.post(router.url + "/v1/completions", json=STREAM)
    await resp.content.readany()
    resp.close()  # the client walks away mid-stream
    for _ in range(300):
        if worker.num_disconnects:
            break
        await asyncio.sleep(0.01)
    assert worker.num_disconnects == 1
    for _ in range(300):
        if router.state.admission.num_inflight == 0:
            break
        await asyncio.sleep(0.01)
    assert router.state.admission.num_inflight == 0
    assert router.state.pool.workers[worker.url].num_outstanding == 0


async def test_no_healthy_worker_answers_503_in_openai_shape(start_worker, start_router):
    worker = await start_worker(is_ready=False)
    router = await start_router([worker], wait_healthy=0)
    async with router.session.post(router.url + "/v1/completions", json=STREAM) as r:
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert (await r.json())["error"]["code"] == "no_healthy_workers"
    async with router.session.get(router.url + "/ready") as r:
        assert r.status == 503


async def test_the_openai_client_raises_on_a_broken_stream(start_worker, start_router):
    import openai

    worker = await start_worker(num_tokens=10, die_after_chunks=3)
    router = await start_router([worker])
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    stream = await client.completions.create(model="fake", prompt="hi", stream=True)
    received = []
    try:
        async for chunk in stream:
            received.append(chunk.choices[0].text)
        raise AssertionError("the stream ended without an error")
    except openai.APIError as exc:
        assert "incomplete" in exc.message
    assert received == ["t0 ", "t1 ", "t2 "]
    await client.close()
