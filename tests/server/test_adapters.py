"""LoRA adapters on the worker, against the fake engine: `/v1/models`, choosing an adapter by
`model`, vLLM's load/unload routes (off by default, behind the API key), 400s naming what is
wrong with a bad adapter, and `vllm:lora_requests_info`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from frota.server.adapters import LoRAOptions
from frota.server.app import ServerOptions, create_app
from tests.cli.https_server import LocalCA, make_ca, serving
from tests.server.conftest import MODEL, bindings, start
from tests.server.fake_engine import FakeEngine, write_adapter

COMP = "/v1/completions"
CHAT = "/v1/chat/completions"
LOAD = "/v1/load_lora_adapter"
UNLOAD = "/v1/unload_lora_adapter"


def greedy(prompt: str, model: str, max_tokens: int = 4) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}


@pytest.fixture
def sql_path(tmp_path: Path) -> str:
    return write_adapter(tmp_path / "sql", rank=8)


@pytest.fixture
def lora_engine() -> FakeEngine:
    return FakeEngine(max_loras=2, max_lora_rank=16)


@pytest.fixture
async def lora_client(lora_engine: FakeEngine, sql_path: str) -> AsyncIterator[TestClient]:
    c = await start(lora_engine, warmup=False,
                    lora=LoRAOptions(modules=[("sql", sql_path)], runtime_loading=True))
    yield c
    await c.close()


async def test_models_lists_the_base_then_each_adapter_with_its_parent_and_path(
        lora_client: TestClient, sql_path: str) -> None:
    cards = (await (await lora_client.get("/v1/models")).json())["data"]
    assert [c["id"] for c in cards] == [MODEL, "sql"]
    assert "parent" not in cards[0]
    adapter = cards[1]
    assert adapter["object"] == "model" and adapter["owned_by"] == "frota"
    assert adapter["parent"] == MODEL and adapter["root"] == sql_path
    assert adapter["max_model_len"] == cards[0]["max_model_len"]
    assert isinstance(adapter["created"], int)


async def test_model_names_the_adapter_a_request_runs_under(lora_client: TestClient,
                                                            lora_engine: FakeEngine) -> None:
    base = await (await lora_client.post(COMP, json=greedy("a", MODEL))).json()
    tuned = await (await lora_client.post(COMP, json=greedy("a", "sql"))).json()
    assert base["choices"][0]["text"] == "bcde"
    assert tuned["choices"][0]["text"] == "jsaj"  # the fake's rank-8 adapter steps 9 letters
    assert (base["model"], tuned["model"]) == (MODEL, "sql")
    chat = await (await lora_client.post(CHAT, json={
        "model": "sql", "messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
        "temperature": 0})).json()
    assert chat["model"] == "sql"
    assert len(lora_engine.requests) == 3


@pytest.mark.parametrize("path", [COMP, CHAT])
async def test_an_unknown_model_is_a_404_model_not_found(lora_client: TestClient,
                                                         path: str) -> None:
    body = {"model": "nope", "prompt": "a", "messages": [{"role": "user", "content": "a"}]}
    resp = await lora_client.post(path, json=body)
    assert resp.status == 404
    error = (await resp.json())["error"]
    assert (error["type"], error["code"], error["param"]) == ("NotFoundError", "model_not_found",
                                                              "model")
    assert "nope" in error["message"]


async def test_runtime_loading_is_off_by_default(lora_engine: FakeEngine, sql_path: str) -> None:
    client = await start(lora_engine, warmup=False, lora=LoRAOptions(modules=[("sql", sql_path)]))
    try:
        for path in (LOAD, UNLOAD):
            resp = await client.post(path, json={"lora_name": "x", "lora_path": sql_path})
            assert resp.status == 404, path
        assert (await client.post(COMP, json=greedy("a", "sql"))).status == 200
    finally:
        await client.close()


async def test_load_then_serve_then_unload_as_vllm_answers(lora_client: TestClient,
                                                           tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "chat", rank=2)
    resp = await lora_client.post(LOAD, json={"lora_name": "chat", "lora_path": path})
    assert resp.status == 200
    assert await resp.text() == "Success: LoRA adapter 'chat' added successfully."
    ids = [c["id"] for c in (await (await lora_client.get("/v1/models")).json())["data"]]
    assert ids == [MODEL, "sql", "chat"]
    out = await (await lora_client.post(COMP, json=greedy("a", "chat"))).json()
    assert out["choices"][0]["text"] == "dgjm"  # rank 2: three letters a step

    resp = await lora_client.post(UNLOAD, json={"lora_name": "chat"})
    assert resp.status == 200
    assert await resp.text() == "Success: LoRA adapter 'chat' removed successfully."
    assert (await lora_client.post(COMP, json=greedy("a", "chat"))).status == 404
    again = await lora_client.post(UNLOAD, json={"lora_name": "chat"})
    assert again.status == 404
    assert (await again.json())["error"]["code"] == "adapter_not_found"


def _corrupt(tmp_path: Path) -> str:
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "adapter_config.json").write_text("{not json")
    return str(d)


@pytest.mark.parametrize(("make", "name", "code", "says"), [
    (lambda t: str(t / "missing"), "new", "invalid_adapter", "missing"),
    (_corrupt, "new", "invalid_adapter", "not valid JSON"),
    (lambda t: write_adapter(t / "big", rank=64), "new", "invalid_adapter",
     "above max_lora_rank 16"),
    (lambda t: write_adapter(t / "emb", targets=("embed_tokens",)), "new", "invalid_adapter",
     "embed_tokens"),
    (lambda t: write_adapter(t / "dup"), "sql", "adapter_exists", "already loaded"),
    (lambda t: write_adapter(t / "base"), MODEL, "adapter_exists", "base model"),
], ids=["missing", "corrupt", "rank", "target", "taken", "base-name"])
async def test_a_bad_adapter_is_a_400_naming_what_is_wrong(lora_client: TestClient,
                                                          tmp_path: Path, make, name: str,
                                                          code: str, says: str) -> None:
    resp = await lora_client.post(LOAD, json={"lora_name": name, "lora_path": make(tmp_path)})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == code
    assert says in error["message"]
    ids = [c["id"] for c in (await (await lora_client.get("/v1/models")).json())["data"]]
    assert ids == [MODEL, "sql"]  # nothing else changed


@pytest.mark.parametrize(("path", "body", "param"), [
    (LOAD, {"lora_name": "x"}, "lora_path"), (LOAD, {"lora_path": "/p"}, "lora_name"),
    (LOAD, {"lora_name": 3, "lora_path": "/p"}, "lora_name"), (UNLOAD, {}, "lora_name")])
async def test_a_load_body_without_its_fields_is_a_400_naming_the_field(
        lora_client: TestClient, path: str, body: dict, param: str) -> None:
    resp = await lora_client.post(path, json=body)
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == param


async def test_requests_in_flight_on_an_adapter_finish_unchanged_through_loads_and_unloads(
        lora_engine: FakeEngine, lora_client: TestClient, tmp_path: Path) -> None:
    lora_engine.step_s = 0.01
    other = write_adapter(tmp_path / "other", rank=2)
    assert (await lora_client.post(LOAD, json={"lora_name": "other", "lora_path": other})).status \
        == 200
    running = asyncio.create_task(lora_client.post(COMP, json=greedy("a", "sql", 20)))
    while not lora_engine.running:
        await asyncio.sleep(0.005)
    bad = await lora_client.post(LOAD, json={"lora_name": "bad", "lora_path": str(tmp_path)})
    assert bad.status == 400
    assert (await lora_client.post(UNLOAD, json={"lora_name": "other"})).status == 200
    assert (await lora_client.post(UNLOAD, json={"lora_name": "sql"})).status == 200
    body = await (await running).json()
    alphabet = "abcdefghijklmnopqrstuvwxyz "
    expected = "".join(alphabet[(9 * i) % 27] for i in range(1, 21))
    assert body["choices"][0]["text"] == expected  # still the weights it started with


async def test_the_adapter_routes_are_behind_the_api_key(lora_engine: FakeEngine,
                                                         tmp_path: Path) -> None:
    client = await start(lora_engine, warmup=False, api_key="s3cret",
                         lora=LoRAOptions(runtime_loading=True))
    body = {"lora_name": "x", "lora_path": write_adapter(tmp_path / "x")}
    try:
        resp = await client.post(LOAD, json=body)
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "invalid_api_key"
        wrong = await client.post(LOAD, json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401
        assert (await client.post(COMP, json=greedy("a", "x"))).status == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert (await client.post(LOAD, json=body, headers=auth)).status == 200
        assert (await client.post(COMP, json=greedy("a", "x"), headers=auth)).status == 200
        assert (await client.get("/health")).status == 200  # probes need no key
        assert (await client.get("/metrics")).status == 200
    finally:
        await client.close()


async def test_metrics_name_the_adapters_running_and_the_slots(lora_engine: FakeEngine,
                                                               lora_client: TestClient) -> None:
    lora_engine.step_s = 0.01
    running = asyncio.create_task(lora_client.post(COMP, json=greedy("a", "sql", 30)))
    while not lora_engine.running:
        await asyncio.sleep(0.005)
    text = await (await lora_client.get("/metrics")).text()
    await running
    line = next(x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{"))
    assert 'running_lora_adapters="sql"' in line
    assert 'waiting_lora_adapters=""' in line and 'max_lora="2"' in line
    assert float(line.rsplit(" ", 1)[1]) > 1.7e9  # a timestamp, as vLLM's


async def test_without_lora_there_is_no_lora_metric_and_no_adapter_routes(
        client: TestClient) -> None:
    assert "vllm:lora_requests_info" not in await (await client.get("/metrics")).text()
    assert (await client.post(LOAD, json={"lora_name": "x", "lora_path": "/p"})).status == 404
    cards = (await (await client.get("/v1/models")).json())["data"]
    assert [c["id"] for c in cards] == [MODEL]


async def test_a_bad_adapter_in_lora_modules_fails_the_start_naming_it(
        lora_engine: FakeEngine, sql_path: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    bad = str(tmp_path / "absent")
    options = ServerOptions(MODEL, warmup=False,
                            lora=LoRAOptions(modules=[("sql", sql_path), ("broken", bad)]))
    client = TestClient(TestServer(create_app(options, bindings(lora_engine))))
    with caplog.at_level(logging.ERROR, logger="frota.server"):
        await client.start_server()
        try:
            async with asyncio.timeout(5):
                while (await (await client.get("/ready")).json())["status"] != "failed":
                    await asyncio.sleep(0.01)
        finally:
            await client.close()
    message = next(r.getMessage() for r in caplog.records if "broken" in r.getMessage())
    assert f"--lora-modules broken={bad}" in message and "missing" in message


async def test_a_streamed_request_for_an_adapter_streams_its_output(
        lora_client: TestClient) -> None:
    resp = await lora_client.post(COMP, json={**greedy("a", "sql"), "stream": True})
    events = [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "jsaj"
    assert {c["model"] for c in chunks} == {"sql"}


# --- runtime loads from an https:// URI (a real HTTPS server, a CA made for the test) ----


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def adapter_cache(tmp_path: Path, local_ca: LocalCA, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    monkeypatch.setenv("FROTA_ADAPTER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def served_adapter(tmp_path: Path, rank: int) -> dict[str, bytes]:
    directory = Path(write_adapter(tmp_path / "served", rank=rank))
    return {"/loras/chat/adapter_config.json": (directory / "adapter_config.json").read_bytes(),
            "/loras/chat/adapter_model.safetensors": b"weights the fake engine does not read"}


async def test_a_lora_path_over_https_is_downloaded_into_the_cache_then_served(
        lora_client: TestClient, lora_engine: FakeEngine, local_ca: LocalCA,
        adapter_cache: Path, tmp_path: Path) -> None:
    with serving(local_ca, served_adapter(tmp_path, rank=2)) as base:
        uri = f"{base}/loras/chat/"
        resp = await lora_client.post(LOAD, json={"lora_name": "chat", "lora_path": uri})
        assert (resp.status, await resp.text()) == (200, "Success: LoRA adapter 'chat' added successfully.")
    assert lora_engine.loaded["chat"].path == str(adapter_cache / "chat")
    assert sorted(p.name for p in (adapter_cache / "chat").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]
    cards = (await (await lora_client.get("/v1/models")).json())["data"]
    assert cards[-1]["id"] == "chat" and cards[-1]["root"] == uri
    out = await (await lora_client.post(COMP, json=greedy("a", "chat"))).json()
    assert out["choices"][0]["text"] == "dgjm"  # rank 2, as when loaded from a directory


@pytest.mark.parametrize(("files", "says"), [
    ({}, "adapter_config.json: HTTP 404"),
    (None, "TLS verification failed"),
], ids=["missing", "untrusted"])
async def test_a_failed_download_is_a_400_naming_the_uri_and_the_engine_is_untouched(
        lora_client: TestClient, lora_engine: FakeEngine, local_ca: LocalCA,
        adapter_cache: Path, monkeypatch: pytest.MonkeyPatch, files: dict | None, says: str) -> None:
    if files is None:
        monkeypatch.delenv("SSL_CERT_FILE")
    with serving(local_ca, files or {}) as base:
        uri = f"{base}/loras/chat"
        resp = await lora_client.post(LOAD, json={"lora_name": "chat", "lora_path": uri})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert uri in error["message"] and says in error["message"]
    assert (error["code"], error["param"]) == ("invalid_adapter", "lora_path")
    assert sorted(lora_engine.loaded) == ["sql"]
    assert not adapter_cache.exists() or list(adapter_cache.iterdir()) == []


async def test_a_downloaded_adapter_the_engine_refuses_leaves_no_directory(
        lora_client: TestClient, local_ca: LocalCA, adapter_cache: Path, tmp_path: Path) -> None:
    with serving(local_ca, served_adapter(tmp_path, rank=64)) as base:
        resp = await lora_client.post(LOAD, json={"lora_name": "chat",
                                                  "lora_path": f"{base}/loras/chat"})
    assert resp.status == 400
    assert "above max_lora_rank 16" in (await resp.json())["error"]["message"]
    assert list(adapter_cache.iterdir()) == []


async def test_a_name_that_cannot_be_a_directory_is_refused_before_any_download(
        lora_client: TestClient, adapter_cache: Path) -> None:
    resp = await lora_client.post(LOAD, json={"lora_name": "../escape",
                                              "lora_path": "https://127.0.0.1:1/x"})
    assert resp.status == 400
    assert "cannot name a download directory" in (await resp.json())["error"]["message"]
    assert not adapter_cache.exists()
