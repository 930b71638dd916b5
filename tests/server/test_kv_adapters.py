"""Disaggregated serving with adapters: the KV handle names the adapter the prefill ran under,
and a decode worker refuses KV of another adapter before pulling anything.

The engine's KV transfer is a stand-in here (its own tests are in tests/disagg); what is
pinned is the worker's side: which adapter goes into the handle and into the sequences."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from frota.api.contract import InternalHeader
from frota.api.fleet_key import Keyring, generate_key
from frota.server.adapters import LoRAOptions
from frota.server.app import ServerOptions, create_app
from frota.server.kv_routes import KVOptions, add_kv_routes
from tests.server.conftest import MODEL, bindings, wait_ready
from tests.server.fake_engine import FakeEngine, StubKV, prefill_handle, write_adapter

KEYRING = Keyring(generate_key().encode())


@pytest.fixture
async def kv_client(tmp_path: Path) -> AsyncIterator[tuple[TestClient, StubKV]]:
    engine = FakeEngine(max_loras=2)
    kv = StubKV()
    engine.kv_transfer = kv  # type: ignore[attr-defined]
    lora = LoRAOptions(modules=[("sql", write_adapter(tmp_path / "sql"))])
    app = create_app(ServerOptions(MODEL, warmup=False, lora=lora, keyring=KEYRING),
                     bindings(engine))
    add_kv_routes(app, KVOptions("both", advertise_url="http://127.0.0.1:9"))
    client = TestClient(TestServer(app))
    await client.start_server()
    await wait_ready(client)
    yield client, kv
    await client.close()


@pytest.mark.parametrize("model", [MODEL, "sql"])
async def test_the_prefill_handle_names_the_adapter_it_ran_under(kv_client, model: str) -> None:  # type: ignore[no-untyped-def]
    client, kv = kv_client
    handle = await prefill_handle(client, KEYRING.authorization(), model)
    expected = None if model == MODEL else "sql"
    assert handle["adapter"] == expected
    assert [(s.adapter, s.keep_kv) for s in kv.sequences] == [(expected, True)]


def _handle(adapter: str | None) -> str:
    return json.dumps(KEYRING.sign({
        "url": "http://127.0.0.1:9", "id": "h1", "fingerprint": "fp", "prompt_digest": "digest-2",
        "num_prompt_tokens": 2, "first_token": 99, "adapter": adapter,
        "expires_at": time.time() + 30}))


@pytest.mark.parametrize(("sent", "model"), [(None, "sql"), ("sql", MODEL), ("other", "sql")])
async def test_decode_refuses_kv_of_another_adapter_before_pulling(kv_client, sent: str | None,  # type: ignore[no-untyped-def]
                                                                   model: str) -> None:
    client, kv = kv_client
    resp = await client.post("/v1/completions", headers={InternalHeader.KV_HANDLE: _handle(sent)},
                             json={"model": model, "prompt": "ab", "max_tokens": 4})
    assert resp.status == 409
    error = (await resp.json())["error"]
    assert error["code"] == "kv_adapter_mismatch" and error["param"] == "model"
    assert kv.sequences == []  # nothing reserved, nothing pulled


async def test_decode_under_the_same_adapter_goes_on_to_pull(kv_client) -> None:  # type: ignore[no-untyped-def]
    client, kv = kv_client
    resp = await client.post("/v1/completions", headers={InternalHeader.KV_HANDLE: _handle("sql")},
                             json={"model": "sql", "prompt": "ab", "max_tokens": 4})
    # Past the adapter check: the pull itself fails (no prefill worker at that URL).
    assert resp.status == 424, await resp.text()
    assert [s.adapter for s in kv.sequences] == ["sql"]
