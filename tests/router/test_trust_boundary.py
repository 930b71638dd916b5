"""The router is the fleet's one door: what passes it inwards and what comes back out
(docs/security.md). Worker doubles record what they were sent."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from frota.api.contract import InternalHeader
from frota.api.fleet_key import Keyring, generate_key
from frota.router.app import RouterConfig
from frota.router.server import Limits

BODY = b'{"prompt": "x", "max_tokens": 2}'


async def send_raw(port: int, head_lines: list[str]) -> bytes:
    """POST a completion with exactly these header lines; the answer's head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "\r\n".join(["POST /v1/completions HTTP/1.1", "Host: router", *head_lines,
                        "Content-Type: application/json", f"Content-Length: {len(BODY)}",
                        "", ""])
    writer.write(head.encode() + BODY)
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    return answer


@pytest.mark.parametrize("name", [InternalHeader.KV_HANDLE, "X-Frota-KV-Handle",
                                  InternalHeader.KV_FINGERPRINT, "x-frota-priority",
                                  "X-FROTA-ANYTHING", "x-forwarded-for", "cookie"])
async def test_a_clients_internal_or_unlisted_header_never_reaches_a_worker(
        start_worker, start_router, name: str) -> None:
    worker = await start_worker()
    router = await start_router([worker])
    answer = await send_raw(router.app.port, [f"{name}: " + '{"url": "http://127.0.0.1:1"}'])
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert name not in worker.headers[0]
    assert not any(k.lower().startswith("x-frota-") for k in worker.headers[0])


async def test_headers_named_in_connection_stop_at_the_router(start_worker, start_router) -> None:
    worker = await start_worker()
    router = await start_router([worker])
    answer = await send_raw(router.app.port, ["Connection: keep-alive, User-Agent",
                                              "Connection: Traceparent", "User-Agent: spy/1",
                                              "traceparent: 00-a-b-01", "tracestate: k=v"])
    assert answer.startswith(b"HTTP/1.1 200 ")
    seen = worker.headers[0]
    assert "User-Agent" not in seen and "traceparent" not in seen
    assert seen["tracestate"] == "k=v"


async def test_no_answer_names_its_worker_unless_debug_headers(start_worker, start_router) -> None:
    worker = await start_worker(answer_headers={"X-Frota-Internal": "10.1.2.3"})
    quiet = await start_router([worker], debug_headers=False)
    for body in ({"prompt": "x"}, {"prompt": "x", "stream": True}):
        async with quiet.session.post(quiet.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert not [k for k in r.headers if k.lower().startswith("x-frota-")], r.headers
            assert worker.url not in str(r.headers) and worker.url not in await r.text()
    loud = await start_router([worker])  # the tests' routers run with --debug-headers
    async with loud.session.post(loud.url + "/v1/completions", json={"prompt": "x"}) as r:
        assert r.headers[InternalHeader.WORKER] == worker.url
        assert "X-Frota-Internal" not in r.headers  # a worker's own internal header: never


async def test_every_answer_carries_its_own_request_id(start_worker, start_router) -> None:
    worker = await start_worker()
    router = await start_router([worker])
    ids = []
    for _ in range(3):
        async with router.session.post(router.url + "/v1/completions", json={"prompt": "x"}) as r:
            ids.append(r.headers["x-request-id"])
    assert len(set(ids)) == 3
    assert [h["X-Request-Id"] for h in worker.headers] == ids


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_a_worker_failure_reaches_the_client_without_the_workers_words(
        start_worker, start_router, caplog, status: int) -> None:
    secret = "Traceback: engine at http://10.9.8.7:8001 layout {block_size: 16} fp 1a2b3c"
    worker = await start_worker(answer_status=status, error_message=secret)
    router = await start_router([worker], debug_headers=False)
    with caplog.at_level(logging.WARNING, logger="frota.router.proxy"):
        async with router.session.post(router.url + "/v1/completions",
                                       json={"prompt": "x"}) as r:
            text = await r.text()
            request_id = r.headers["x-request-id"]
            assert r.status == status
            if status == 503:
                assert r.headers["Retry-After"] == "1"
    assert secret not in text and "10.9.8.7" not in text and "Traceback" not in text
    error = json.loads(text)["error"]
    assert request_id in error["message"]
    # ... and the router's log has both, for whoever operates the fleet.
    assert any(request_id in rec.getMessage() and secret in rec.getMessage()
               for rec in caplog.records)


async def test_a_workers_client_error_passes_through(start_worker, start_router) -> None:
    worker = await start_worker(answer_status=400, error_message="max_tokens must be positive")
    router = await start_router([worker])
    async with router.session.post(router.url + "/v1/completions", json={"prompt": "x"}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["message"] == "max_tokens must be positive"


async def test_the_routers_view_of_its_workers_is_for_the_fleet_only(
        start_worker, start_router) -> None:
    worker = await start_worker()
    keyring = Keyring(generate_key().encode())
    router = await start_router([worker], RouterConfig(probe_interval=0.05, keyring=keyring),
                                debug_headers=False)
    for headers in ({}, {"Authorization": "Bearer x"},
                    dict([Keyring(generate_key().encode()).authorization()])):
        async with router.session.get(router.url + "/router/workers", headers=headers) as r:
            assert r.status == 403
            assert worker.url not in await r.text()
    async with router.session.get(router.url + "/router/workers",
                                  headers=dict([keyring.authorization()])) as r:
        assert r.status == 200
        assert (await r.json())["workers"][0]["url"] == worker.url


async def test_the_routers_metrics_count_open_connections_and_those_turned_away(
        start_worker, start_router) -> None:
    worker = await start_worker()
    router = await start_router([worker], RouterConfig(probe_interval=0.05,
                                                            limits=Limits(max_connections=2)))
    held = [await asyncio.open_connection("127.0.0.1", router.app.port) for _ in range(2)]
    reader, writer = await asyncio.open_connection("127.0.0.1", router.app.port)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After" in head
    writer.close()
    for _, w in held[1:]:
        w.close()
    await asyncio.sleep(0.1)  # the server sees the closes
    r, w = held[0]
    w.write(b"GET /metrics HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    text = (await asyncio.wait_for(r.read(), 5)).decode()
    w.close()
    assert 'frota_router_connections_cut_total{reason="max_connections"} 1.0' in text
    assert "frota_router_connections 1.0" in text  # the one asking
