"""The router's HTTP surface: auth, admission (429), request validation, errors, health and metrics."""

import asyncio
import contextlib
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from frota.router.app import RouterConfig, build_app, read_api_keys
from frota.router.discovery import StaticDiscovery

BODY = {"model": "fake", "prompt": "hello", "stream": True}


async def test_api_keys_are_required_when_configured(start_worker, start_router, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nsk-one\n\nsk-two\n")
    assert read_api_keys(keys) == {"sk-one", "sk-two"}
    worker = await start_worker()
    router = await start_router([worker], RouterConfig(probe_interval=0.05,
                                                        api_keys=read_api_keys(keys)))
    url = router.url + "/v1/completions"
    async with router.session.post(url, json=BODY) as r:
        assert r.status == 401
        error = (await r.json())["error"]
        assert error["code"] == "invalid_api_key" and "missing" in error["message"]
    async with router.session.post(url, json=BODY, headers={"Authorization": "Bearer no"}) as r:
        assert r.status == 401
        assert "incorrect" in (await r.json())["error"]["message"]
    for key in ("sk-one", "sk-two"):
        async with router.session.post(url, json=BODY,
                                       headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200
    assert len(worker.bodies) == 2
    async with router.session.get(router.url + "/health") as r:  # probes need no key
        assert r.status == 200


async def test_overload_beyond_the_queue_gets_429_with_retry_after(start_worker, start_router):
    gate = asyncio.Event()
    worker = await start_worker(gate=gate, gate_at_chunk=0)
    config = RouterConfig(probe_interval=0.05, max_inflight=4, max_queue=4, queue_timeout=30)
    router = await start_router([worker], config)

    async def one() -> int:
        async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
            await r.read()
            return r.status

    tasks = [asyncio.create_task(one()) for _ in range(20)]
    for _ in range(500):
        if sum(t.done() for t in tasks) == 12:
            break
        await asyncio.sleep(0.01)
    assert sorted(t.result() for t in tasks if t.done()) == [429] * 12  # rejected at once
    gate.set()
    statuses = await asyncio.gather(*tasks)
    assert statuses.count(200) == 8 and statuses.count(429) == 12
    assert router.metric("frota_router_rejections_total", reason="queue_full") == 12
    assert router.metric("frota_router_requests_total", endpoint="/v1/completions",
                         status="429") == 12


async def test_a_queue_timeout_answers_429(start_worker, start_router):
    gate = asyncio.Event()
    worker = await start_worker(gate=gate, gate_at_chunk=0)
    config = RouterConfig(probe_interval=0.05, max_inflight=1, max_queue=4, queue_timeout=0.05)
    router = await start_router([worker], config)
    first = asyncio.create_task(router.session.post(router.url + "/v1/completions", json=BODY))
    await asyncio.sleep(0.05)
    async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert (await r.json())["error"]["code"] == "queue_timeout"
    gate.set()
    (await first).close()


async def test_unknown_paths_and_bad_json_answer_in_openai_shape(start_worker, start_router):
    from frota.router.policies import PolicyName

    worker = await start_worker()
    router = await start_router([worker], RouterConfig(probe_interval=0.05,
                                                        policy=PolicyName.PREFIX_AWARE))
    async with router.session.get(router.url + "/v2/nothing") as r:
        assert r.status == 404 and (await r.json())["error"]["type"] == "invalid_request_error"
    async with router.session.post(router.url + "/v1/completions", data=b"{oops") as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"


BAD_BODIES = [
    # (endpoint, body, the param the 400 names)
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]},
     "messages[0].role"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": None}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"model": "m", "messages": []}, "messages"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "temperature": -1.0}, "temperature"),
]


@pytest.mark.parametrize(("endpoint", "body", "param"), BAD_BODIES)
async def test_validate_requests_refuses_what_frotas_workers_refuse_before_any_worker_sees_it(
        start_worker, start_router, endpoint, body, param):
    # The stand-in worker accepts anything, as vLLM accepts an unknown role.
    worker = await start_worker()
    checked = await start_router([worker], RouterConfig(probe_interval=0.05, validate_requests=True))
    async with checked.session.post(checked.url + endpoint, json=body) as r:
        assert r.status == 400, await r.text()
        error = (await r.json())["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert worker.bodies == []
    # Without the flag the same body reaches the worker: the router stays out of the way.
    plain = await start_router([worker])
    async with plain.session.post(plain.url + endpoint, json=body) as r:
        assert r.status == 200
    assert len(worker.bodies) == 1


async def test_validate_requests_passes_good_bodies_unchanged_and_names_bad_json(
        start_worker, start_router):
    worker = await start_worker()
    router = await start_router([worker], RouterConfig(probe_interval=0.05, validate_requests=True))
    good = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 4, "some_extension": True}
    async with router.session.post(router.url + "/v1/chat/completions", json=good) as r:
        assert r.status == 200
    assert worker.bodies == [good]
    for raw in (b"{oops", b"[1, 2]"):
        async with router.session.post(router.url + "/v1/completions", data=raw) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"
    assert len(worker.bodies) == 1


async def test_metrics_count_requests_decisions_and_latency(start_worker, start_router):
    a, b = await start_worker(), await start_worker()
    router = await start_router([a, b])
    before = time.time()
    for _ in range(4):
        async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
            await r.read()
    async with router.session.get(router.url + "/metrics") as r:
        text = await r.text()
    last = next(f for f in text_string_to_metric_families(text)
                if f.name == "frota_router_last_request_timestamp_seconds").samples[0].value
    assert before <= last <= time.time()  # what scale to zero judges idleness by
    assert 'frota_router_requests_total{endpoint="/v1/completions",status="200"} 4.0' in text
    for worker in (a, b):
        assert (f'frota_router_routing_decisions_total{{decision="next",policy="round-robin",'
                f'worker="{worker.url}"}} 2.0') in text
    for name in ("frota_router_time_to_first_token_seconds_count 4.0",
                 "frota_router_inter_token_latency_seconds_count",
                 "frota_router_upstream_latency_seconds_bucket", "frota_router_queue_depth",
                 f'frota_router_worker_healthy{{worker="{a.url}"}} 1.0'):
        assert name in text


async def test_the_outstanding_gauge_reads_each_workers_requests_in_flight(
        start_worker, start_router):
    """Read from the workers' own counts when scraped: a stream shows while it runs, is
    gone from the count once it ends, and a worker that left has no series."""
    a, b = [await start_worker(num_tokens=1000, token_delay=0.01) for _ in range(2)]
    router = await start_router([a, b])

    async def outstanding() -> dict[str, float]:
        async with router.session.get(router.url + "/metrics") as r:
            text = await r.text()
        family = next(f for f in text_string_to_metric_families(text)
                      if f.name == "frota_router_worker_outstanding_requests")
        return {s.labels["worker"]: s.value for s in family.samples}

    assert await outstanding() == {a.url: 0, b.url: 0}
    resp = await router.session.post(router.url + "/v1/completions", json=BODY)
    await resp.content.readany()
    assert sorted((await outstanding()).values()) == [0, 1]
    resp.close()
    for _ in range(300):
        if sum((await outstanding()).values()) == 0:
            break
        await asyncio.sleep(0.01)
    assert await outstanding() == {a.url: 0, b.url: 0}
    router.state.pool.set_urls([b.url])
    assert await outstanding() == {b.url: 0}


async def test_health_ready_and_worker_listing(start_worker, start_router):
    worker = await start_worker()
    router = await start_router([worker])
    async with router.session.get(router.url + "/ready") as r:
        assert r.status == 200 and (await r.json())["healthy_workers"] == 1
    async with router.session.get(router.url + "/router/workers") as r:
        listing = await r.json()
    assert listing["workers"][0]["url"] == worker.url and listing["workers"][0]["healthy"]


async def test_stop_lets_a_stream_in_flight_run_for_the_drain_timeout(
        start_worker, start_router):
    """A generation outlives the HTTP server's own short grace: the router's drain waits
    for it as long as `drain_timeout` says, and cuts off (and says so) only after that."""
    gate = asyncio.Event()
    worker = await start_worker(gate=gate, gate_at_chunk=2, num_tokens=4)
    router = await start_router([worker], RouterConfig(probe_interval=0.05, drain_timeout=30))
    async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
        assert r.status == 200
        await r.content.readuntil(b"\n\n")
        stopping = asyncio.create_task(router.app.stop())
        await asyncio.sleep(0.5)
        assert not stopping.done()  # still draining: the stream is open
        gate.set()
        body = await r.read()
    assert b"t3" in body and body.endswith(b"data: [DONE]\n\n")
    await asyncio.wait_for(stopping, 5)


async def test_stop_cuts_off_what_is_left_at_the_drain_timeout(
        start_worker, start_router, caplog):
    gate = asyncio.Event()  # never set: the stream would run forever
    worker = await start_worker(gate=gate, gate_at_chunk=1)
    router = await start_router([worker], RouterConfig(probe_interval=0.05, drain_timeout=0.3))
    async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
        await r.content.readuntil(b"\n\n")
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(router.app.stop(), 5)
        assert asyncio.get_running_loop().time() - started < 3
        rest = b""
        with contextlib.suppress(aiohttp.ClientPayloadError):  # cut off mid-stream
            rest = await r.read()
        assert b"[DONE]" not in rest
    assert "cutting 1 connection(s), 1 with a request in flight" in caplog.text


async def test_two_routers_share_a_port_with_reuse_port(start_worker):
    worker = await start_worker()
    apps = [build_app(RouterConfig(probe_interval=0.05), StaticDiscovery([worker.url]))
            for _ in range(2)]
    port = await apps[0].start("127.0.0.1", 0, reuse_port=True)
    try:
        assert await apps[1].start("127.0.0.1", port, reuse_port=True) == port
        await apps[0].stop()  # the other one goes on serving the port
        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{port}/health") as r:
            assert r.status == 200
    finally:
        for app in apps:
            await app.stop()
