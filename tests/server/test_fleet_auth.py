"""A worker's internal side answers only to its fleet (docs/security.md).

- `/internal/*` and the adapter routes need the fleet's credential; a worker without a fleet
  key closes `/internal/*` altogether.
- A KV handle is checked (signature, then expiry) before anything else: a forged, tampered
  or expired one is a 403, and the worker connects nowhere (a canary server on loopback
  counts connections).
- What a refusal says names no URL, fingerprint or layout.

The engine's KV transfer is a stand-in (`StubKV`); tests/disagg runs the real one.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from frota.api.contract import InternalHeader
from frota.api.fleet_key import Keyring, generate_key
from frota.server.adapters import LoRAOptions
from frota.server.app import ServerOptions, create_app
from frota.server.kv_routes import KVOptions, add_kv_routes
from tests.server.conftest import MODEL, bindings, wait_ready
from tests.server.fake_engine import FakeEngine, StubKV, prefill_handle, write_adapter


class Canary:
    """A loopback HTTP server that counts every request it is sent."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.server: TestServer | None = None

    async def start(self) -> str:
        app = web.Application()

        async def anything(request: web.Request) -> web.Response:
            self.hits.append(request.path)
            return web.Response(status=404)

        app.router.add_route("*", "/{tail:.*}", anything)
        self.server = TestServer(app)
        await self.server.start_server()
        return str(self.server.make_url("")).rstrip("/")


@pytest.fixture
async def canary() -> AsyncIterator[tuple[Canary, str]]:
    c = Canary()
    url = await c.start()
    yield c, url
    assert c.server is not None
    await c.server.close()


async def _worker(keyring: Keyring | None, tmp_path: Path) -> tuple[TestClient, StubKV]:
    engine = FakeEngine(max_loras=2)
    kv = StubKV()
    engine.kv_transfer = kv  # type: ignore[attr-defined]
    lora = LoRAOptions(modules=[("sql", write_adapter(tmp_path / "sql"))], runtime_loading=True)
    app = create_app(ServerOptions(MODEL, warmup=False, lora=lora, keyring=keyring),
                     bindings(engine))
    add_kv_routes(app, KVOptions("both"))
    client = TestClient(TestServer(app))
    await client.start_server()
    await wait_ready(client)
    return client, kv


@pytest.fixture
def keyring() -> Keyring:
    return Keyring(generate_key().encode())


@pytest.fixture
async def worker(keyring: Keyring, tmp_path: Path) -> AsyncIterator[tuple[TestClient, StubKV]]:
    client, kv = await _worker(keyring, tmp_path)
    yield client, kv
    await client.close()


def handle_fields(url: str, **overrides: Any) -> dict[str, Any]:
    """A handle for the prompt "ab" (the stub's digest of two tokens), pulled from `url`."""
    return {"url": url, "id": "forged", "fingerprint": "fp", "prompt_digest": "digest-2",
            "num_prompt_tokens": 2, "first_token": 99, "adapter": None,
            "expires_at": time.time() + 30, **overrides}


async def decode(client: TestClient, handle: dict[str, Any] | str) -> tuple[int, str]:
    raw = handle if isinstance(handle, str) else json.dumps(handle)
    resp = await client.post("/v1/completions", headers={InternalHeader.KV_HANDLE: raw},
                             json={"model": MODEL, "prompt": "ab", "max_tokens": 4})
    return resp.status, await resp.text()


INTERNAL_CALLS = [("POST", "/internal/kv/prefill/v1/completions",
                   {"model": MODEL, "prompt": "ab", "max_tokens": 4}),
                  ("GET", "/internal/kv/blocks/anything", None),
                  ("DELETE", "/internal/kv/blocks/anything", None),
                  ("GET", "/internal/kv/layout", None),
                  ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/etc"}),
                  ("POST", "/v1/unload_lora_adapter", {"lora_name": "sql"})]


@pytest.mark.parametrize(("method", "path", "body"), INTERNAL_CALLS)
async def test_internal_endpoints_refuse_a_call_without_the_fleets_credential(
        worker, keyring: Keyring, method: str, path: str, body: Any) -> None:  # type: ignore[no-untyped-def]
    client, kv = worker
    other = Keyring(generate_key().encode())
    for headers in ({}, {"Authorization": "Bearer nonsense"}, dict([other.authorization()]),
                    {"Authorization": keyring.credential}):
        resp = await client.request(method, path, json=body, headers=headers)
        assert resp.status == 403, (headers, await resp.text())
        error = (await resp.json())["error"]
        assert error["code"] == "forbidden" and keyring.credential not in error["message"]
    assert kv.sequences == []


@pytest.mark.parametrize(("method", "path", "body"), INTERNAL_CALLS)
async def test_internal_endpoints_serve_the_fleet(worker, keyring: Keyring, method: str,  # type: ignore[no-untyped-def]
                                                  path: str, body: Any) -> None:
    client, _ = worker
    resp = await client.request(method, path, json=body, headers=dict([keyring.authorization()]))
    assert resp.status != 403, await resp.text()


async def test_a_worker_without_a_fleet_key_closes_its_internal_endpoints(tmp_path: Path) -> None:
    client, kv = await _worker(None, tmp_path)
    try:
        resp = await client.post("/internal/kv/prefill/v1/completions",
                                 json={"model": MODEL, "prompt": "ab", "max_tokens": 4})
        assert resp.status == 403
        status, _ = await decode(client, handle_fields("http://127.0.0.1:9"))
        assert status == 403
        assert kv.sequences == []
    finally:
        await client.close()


async def test_a_prefill_signs_its_handle_with_an_expiry(worker, keyring: Keyring) -> None:  # type: ignore[no-untyped-def]
    client, _ = worker
    handle = await prefill_handle(client, keyring.authorization(), MODEL)
    assert keyring.verify(handle)
    assert time.time() < handle["expires_at"] <= time.time() + KVOptions().handle_ttl_s


async def test_a_forged_handle_is_refused_and_the_worker_connects_nowhere(  # type: ignore[no-untyped-def]
        worker, keyring: Keyring, canary) -> None:
    client, kv = worker
    spy, url = canary
    other = Keyring(generate_key().encode())
    genuine = keyring.sign(handle_fields(url))
    forged = [
        "not json", "[1, 2]", json.dumps(handle_fields(url)),  # unsigned
        other.sign(handle_fields(url)),  # another fleet's key
        {**genuine, "url": url + "/elsewhere"},  # tampered after signing
        {**genuine, "sig": genuine["sig"][:-1] + "0"},
        keyring.sign(handle_fields(url, expires_at=time.time() - 1)),  # expired
        keyring.sign(handle_fields(url, expires_at="tomorrow")),
    ]
    for handle in forged:
        status, text = await decode(client, handle)
        assert status == 403, (handle, text)
        assert json.loads(text)["error"]["code"].startswith("kv_handle_")
    assert spy.hits == [] and kv.sequences == []
    # The same handle, signed and current, does make the pull (the canary answers 404).
    status, text = await decode(client, genuine)
    assert status == 424 and spy.hits == ["/internal/kv/blocks/forged"]
    assert url not in text and "127.0.0.1" not in text


async def test_a_layout_mismatch_says_so_without_the_fingerprint_or_the_layout(  # type: ignore[no-untyped-def]
        worker, keyring: Keyring, canary) -> None:
    client, _ = worker
    spy, url = canary
    status, text = await decode(client, keyring.sign(handle_fields(url, fingerprint="0" * 16)))
    assert status == 409 and json.loads(text)["error"]["code"] == "kv_layout_mismatch"
    assert '"fp"' not in text and "fp " not in text and "block_size" not in text
    assert spy.hits == []


async def test_the_block_stream_refuses_a_layout_mismatch_without_naming_either(  # type: ignore[no-untyped-def]
        worker, keyring: Keyring) -> None:
    client, _ = worker
    resp = await client.get("/internal/kv/blocks/x", headers=dict(
        [keyring.authorization(), (InternalHeader.KV_FINGERPRINT, "f" * 16)]))
    text = await resp.text()
    assert resp.status == 409 and "f" * 16 not in text and "fp" not in text.split(":", 1)[1]


async def test_an_api_key_does_not_open_internal_endpoints(keyring: Keyring, tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.kv_transfer = StubKV()  # type: ignore[attr-defined]
    app = create_app(ServerOptions(MODEL, warmup=False, api_key="k" * 20, keyring=keyring),
                     bindings(engine))
    add_kv_routes(app, KVOptions("both"))
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        await wait_ready(client)
        resp = await client.get("/internal/kv/layout", headers={"Authorization": "Bearer " + "k" * 20})
        assert resp.status == 403
        resp = await client.get("/internal/kv/layout", headers=dict([keyring.authorization()]))
        assert resp.status == 200
    finally:
        await client.close()


def test_disaggregated_roles_need_a_fleet_key() -> None:
    app = create_app(ServerOptions(MODEL, warmup=False), bindings(FakeEngine()))
    with pytest.raises(ValueError, match="fleet key"):
        add_kv_routes(app, KVOptions("decode"))
