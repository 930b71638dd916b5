"""Scale to zero at the router: requests that find no ready worker are held (bounded, in
arrival order), announce the demand once, and get a 503 with Retry-After past the hold."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from frota.router.app import RouterConfig
from frota.router.hold import HoldConfig, url_announcer
from tests.loopback import serving

BODY = {"model": "fake", "prompt": "hello"}


class Supervisor:
    """Stands in for whoever starts workers: counts the router's announcements."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()

    def app(self) -> web.Application:
        async def wake(request: web.Request) -> web.Response:
            self.calls += 1
            self.called.set()
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/wake", wake)
        return app


def held_config(seconds: float, url: str | None = None, max_held: int = 16) -> RouterConfig:
    return RouterConfig(probe_interval=0.05, eject_after=1,
                        hold=HoldConfig(seconds=seconds, max_held=max_held, retry_after=3),
                        announce=url_announcer(url) if url else None)


async def test_held_requests_wait_for_a_worker_and_are_served_in_arrival_order(
        start_worker, start_router):
    worker = await start_worker(is_ready=False, num_tokens=3)
    supervisor = Supervisor()
    async with serving(supervisor.app()) as base:
        router = await start_router([worker], held_config(30, f"{base}/wake"), wait_healthy=0)

        async def send(i: int, stream: bool) -> tuple[int, str]:
            body = {**BODY, "prompt": f"request {i}", "stream": stream}
            async with router.session.post(router.url + "/v1/completions", json=body) as r:
                return r.status, await r.text()

        sent = []
        for i in range(4):
            sent.append(asyncio.create_task(send(i, stream=i % 2 == 1)))
            await asyncio.sleep(0.05)  # a defined arrival order
        await asyncio.wait_for(supervisor.called.wait(), 5)
        await asyncio.sleep(0.3)
        assert router.metric("frota_router_held_requests") == 4
        assert supervisor.calls == 1  # one announcement for the whole burst
        assert worker.bodies == []
        worker.is_ready = True  # the replica came up
        answers = await asyncio.wait_for(asyncio.gather(*sent), 10)
    assert [status for status, _ in answers] == [200] * 4
    assert "[DONE]" in answers[1][1] and json.loads(answers[0][1])["choices"]
    assert [b["prompt"] for b in worker.bodies] == [f"request {i}" for i in range(4)]
    assert router.metric("frota_router_held_requests") == 0


async def test_past_the_hold_time_or_beyond_the_room_the_answer_is_503_with_retry_after(
        start_worker, start_router):
    worker = await start_worker(is_ready=False)
    router = await start_router([worker], held_config(0.5, max_held=2), wait_healthy=0)

    async def send() -> aiohttp.ClientResponse:
        async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
            await r.read()
            return r

    first, second = asyncio.create_task(send()), asyncio.create_task(send())
    await asyncio.sleep(0.1)
    third = await send()  # the room holds two
    assert third.status == 503 and third.headers["Retry-After"] == "3"
    assert (await third.json())["error"]["code"] == "hold_full"
    for task in (first, second):
        response = await task
        assert response.status == 503 and response.headers["Retry-After"] == "3"
        error = (await response.json())["error"]
        assert error["code"] == "hold_timeout" and error["type"] == "service_unavailable"
    assert router.metric("frota_router_requests_total", endpoint="/v1/completions",
                         status="503") == 3


async def test_a_client_that_leaves_leaves_the_queue(start_worker, start_router):
    worker = await start_worker(is_ready=False)
    router = await start_router([worker], held_config(30), wait_healthy=0)
    async with aiohttp.ClientSession() as impatient:
        task = asyncio.create_task(impatient.post(router.url + "/v1/completions", json=BODY))
        for _ in range(100):
            if router.metric("frota_router_held_requests") == 1:
                break
            await asyncio.sleep(0.02)
        assert router.metric("frota_router_held_requests") == 1
        task.cancel()
    for _ in range(100):
        if router.metric("frota_router_held_requests") == 0:
            break
        await asyncio.sleep(0.02)
    assert router.metric("frota_router_held_requests") == 0
    worker.is_ready = True
    await asyncio.sleep(0.3)
    assert worker.bodies == []  # nothing left to send once a worker came


async def test_without_a_hold_time_an_empty_pool_answers_503_at_once(start_worker, start_router):
    worker = await start_worker(is_ready=False)
    router = await start_router([worker], RouterConfig(probe_interval=0.05), wait_healthy=0)
    async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
        assert r.status == 503 and (await r.json())["error"]["code"] == "no_healthy_workers"
    assert router.metric("frota_router_held_requests") == 0
    async with router.session.get(router.url + "/ready") as r:
        assert r.status == 503  # nothing to do with a request: out of the Service's endpoints


async def test_with_a_hold_time_the_router_is_ready_with_no_worker(start_worker, start_router):
    """At zero replicas the router is the fleet's door: its pod stays in the Service's
    endpoints (and a new router pod can roll out) while it holds the next request."""
    worker = await start_worker(is_ready=False)
    router = await start_router([worker], held_config(30), wait_healthy=0)
    async with router.session.get(router.url + "/ready") as r:
        assert r.status == 200
        assert await r.json() == {"status": "holding", "healthy_workers": 0}
    worker.is_ready = True
    await router.app.router.pool.wait_healthy(5)
    async with router.session.get(router.url + "/ready") as r:
        assert (await r.json()) == {"status": "ready", "healthy_workers": 1}


async def test_the_last_request_time_is_exported_for_idleness(start_worker, start_router):
    worker = await start_worker()
    router = await start_router([worker])
    started = router.metric("frota_router_last_request_timestamp_seconds")
    assert started > 0  # the router's start until a request comes
    await asyncio.sleep(0.05)
    async with router.session.post(router.url + "/v1/completions", json=BODY) as r:
        assert r.status == 200
    assert router.metric("frota_router_last_request_timestamp_seconds") > started


async def test_on_a_cluster_the_demand_is_a_merge_patch_of_one_key_of_the_demand_configmap():
    from frota.router.discovery import KubeApi
    from frota.router.hold import kubernetes_announcer

    patches: list[tuple[str, str, dict, str]] = []

    async def patch(request: web.Request) -> web.Response:
        patches.append((request.path, request.content_type, await request.json(),
                        request.headers.get("Authorization", "")))
        return web.json_response({})

    app = web.Application()
    app.router.add_patch("/api/v1/namespaces/{ns}/configmaps/{name}", patch)
    async with serving(app) as base, aiohttp.ClientSession() as session:
        announce = kubernetes_announcer(KubeApi(base, token="sa-token"), "team-a", "smollm2-demand")
        await announce(session)
    ((path, content_type, body, auth),) = patches
    # The one object the router's Role lets it write: never its InferenceService.
    assert path == "/api/v1/namespaces/team-a/configmaps/smollm2-demand"
    assert content_type == "application/merge-patch+json" and auth == "Bearer sa-token"
    assert list(body) == ["data"] and list(body["data"]) == ["demandedAt"]
    stamp = body["data"]["demandedAt"]
    assert stamp.endswith("Z") and stamp.startswith("20")
