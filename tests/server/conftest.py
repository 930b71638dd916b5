"""Fixtures: the worker app around a fake engine, and a real `frota worker` process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from frota.server.app import ServerOptions, create_app
from frota.server.engine_api import EngineBindings
from tests.server.fake_engine import FakeEngine
from tests.server.harness import WorkerProcess, load_tokenizer

MODEL = "fake-model"


def bindings(engine: FakeEngine) -> EngineBindings:
    return EngineBindings(engine)  # no constrained decoding: response_format is refused


async def wait_ready(client: TestClient, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while (await client.get("/ready")).status != 200:
            await asyncio.sleep(0.01)


async def start(engine: FakeEngine, **options: object) -> TestClient:
    app = create_app(ServerOptions(MODEL, **options), bindings(engine))  # type: ignore[arg-type]
    client = TestClient(TestServer(app, handler_cancellation=True))
    await client.start_server()
    await wait_ready(client)
    return client


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def client(engine: FakeEngine) -> AsyncIterator[TestClient]:
    c = await start(engine, warmup=False)
    yield c
    await c.close()


# --- real `frota worker` processes (integration tier) -------------------------------

SMOLLM2_ARGS = ("--max-model-len", "2048", "--max-num-seqs", "16",
                "--kv-cache-memory", "512MiB", "--dtype", "float32")
SYNTHETIC = "synthetic:dense-tiny"


def _worker(tmp_path_factory: pytest.TempPathFactory, model: str, *args: str):  # type: ignore[no-untyped-def]
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    worker = WorkerProcess(model, *args, log_path=log_path).wait_ready()
    worker.model = model  # type: ignore[attr-defined]
    return worker


@pytest.fixture(scope="session")
def smollm2_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    worker = _worker(tmp_path_factory, "smollm2", *SMOLLM2_ARGS)
    yield worker
    assert worker.stop() == 0, worker.log()[-3000:]


@pytest.fixture(scope="session")
def synthetic_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    worker = _worker(tmp_path_factory, SYNTHETIC, "--max-model-len", "256",
                     "--num-kv-blocks", "256", "--max-num-seqs", "8")
    yield worker
    assert worker.stop() == 0, worker.log()[-3000:]


@pytest.fixture(scope="module")
def oai(smollm2_worker: WorkerProcess) -> openai.OpenAI:
    """The official client on the real SmolLM2 worker (no client-side retries)."""
    return openai.OpenAI(base_url=f"{smollm2_worker.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(smollm2_worker: WorkerProcess):  # type: ignore[no-untyped-def]
    return load_tokenizer("smollm2")
