"""Test doubles for the router: small aiohttp workers that speak the worker contract."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from frota.router.app import RouterApp, RouterConfig, build_app
from frota.router.discovery import StaticDiscovery


async def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll `predicate` until it holds (no fixed sleeps in tests); fail after `timeout` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


@dataclass
class FakeWorker:
    """An in-test worker: streams `num_tokens` chunks, records what it served, and
    misbehaves on demand (not ready, answer a status, die mid-stream, stall)."""

    name: str = "w"
    num_tokens: int = 5
    token_delay: float = 0.0
    is_ready: bool = True
    answer_status: int | None = None   # answer every generation request with this status
    die_after_chunks: int | None = None  # cut the connection after this many chunks
    die_mid_chunk: bool = False  # ... after sending the start of one more
    gate: asyncio.Event | None = None  # wait on it before chunk number `gate_at_chunk`
    gate_at_chunk: int = 0
    gauges: dict[str, float] = field(default_factory=dict)
    set_cookie: str | None = None  # a Set-Cookie header on non-streamed answers
    answer_headers: dict[str, str] = field(default_factory=dict)  # more, on non-streamed answers
    error_message: str = "nope"  # what an `answer_status` answer says
    bodies: list[dict] = field(default_factory=list)
    raw_bodies: list[bytes] = field(default_factory=list)
    headers: list[Mapping[str, str]] = field(default_factory=list)
    num_disconnects: int = 0
    num_chunks_sent: int = 0
    chunk_padding: int = 0  # bytes of padding in each streamed chunk
    num_probes: int = 0
    # LoRA, as vLLM's and Frota's workers do it: `vllm:lora_requests_info` on /metrics
    # (`active` adapters running), adapters in /v1/models, load and unload endpoints.
    lora: bool = False
    max_lora: int = 4
    adapters: dict[str, str] = field(default_factory=dict)  # loaded: name -> path
    active: list[str] = field(default_factory=list)
    load_delay: float = 0.0
    metrics_stall: bool = False  # /metrics answers only after 5 s
    load_status: int | None = None  # answer every load with this status
    on_load: Callable[[str], None] | None = None  # called with the name as a load starts
    loads: list[str] = field(default_factory=list)
    load_headers: list[Mapping[str, str]] = field(default_factory=list)
    unloads: list[str] = field(default_factory=list)
    server: TestServer | None = None
    url: str = ""  # set once started; kept after the server closes

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/load_lora_adapter", self._load_adapter)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_adapter)
        return app

    async def _ready(self, request: web.Request) -> web.Response:
        self.num_probes += 1
        return web.json_response({"ready": self.is_ready}, status=200 if self.is_ready else 503)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_stall:
            await asyncio.sleep(5)
        lines = [f"{name} {value}" for name, value in self.gauges.items()]
        if self.lora:  # vLLM keeps the label sets it reported before: the newest counts
            lines += ["# HELP vllm:lora_requests_info Running stats on lora requests.",
                      "# TYPE vllm:lora_requests_info gauge",
                      f'vllm:lora_requests_info{{max_lora="{self.max_lora}",'
                      'running_lora_adapters="stale",waiting_lora_adapters=""} 1.0',
                      f'vllm:lora_requests_info{{max_lora="{self.max_lora}",'
                      f'running_lora_adapters="{",".join(self.active)}",'
                      'waiting_lora_adapters=""} 2.0']
        return web.Response(text="\n".join(lines) + "\n")

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": "fake", "object": "model", "root": "/models/fake", "parent": None}]
        data += [{"id": name, "object": "model", "owned_by": "frota", "root": path,
                  "parent": "fake"} for name, path in self.adapters.items()]
        return web.json_response({"object": "list", "data": data})

    async def _load_adapter(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body["lora_name"]
        self.load_headers.append(request.headers.copy())
        if self.on_load is not None:
            self.on_load(name)
        self.loads.append(name)
        if self.load_delay:
            await asyncio.sleep(self.load_delay)
        if self.load_status is not None:
            return _error(self.load_status, f"cannot load {name}", "BadRequestError",
                          "invalid_adapter")
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.",
                          "BadRequestError", "adapter_exists")
        self.adapters[name] = body["lora_path"]
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_adapter(self, request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        self.unloads.append(name)
        if self.adapters.pop(name, None) is None:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError",
                          "adapter_not_found")
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.raw_bodies.append(raw)
        self.bodies.append(body)
        self.headers.append(request.headers.copy())
        model = body.get("model")
        if self.lora and model not in (None, "fake") and model not in self.adapters:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError",
                          "model_not_found")
        if self.answer_status is not None:
            return web.json_response(
                {"error": {"message": self.error_message, "type": "x", "param": None,
                           "code": None}},
                status=self.answer_status, headers={"Retry-After": "1"})
        if not body.get("stream"):
            headers = dict(self.answer_headers)
            if self.set_cookie:
                headers["Set-Cookie"] = self.set_cookie
            return web.json_response({"id": "cmpl-1", "object": "text_completion",
                                      "worker": self.name,
                                      "choices": [{"text": "tok" * self.num_tokens}]},
                                     headers=headers)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i in range(self.num_tokens):
                if self.gate is not None and i == self.gate_at_chunk:
                    await self.gate.wait()
                if self.die_after_chunks is not None and i == self.die_after_chunks:
                    assert request.transport is not None
                    if self.die_mid_chunk:  # a size line and part of what it announces
                        request.transport.write(b"40\r\ndata: {\"choices\": [")
                        await asyncio.sleep(0.05)
                    request.transport.abort()
                    return response
                chunk = {"choices": [{"index": 0, "text": f"t{i} "}], "worker": self.name,
                         **({"pad": "p" * self.chunk_padding} if self.chunk_padding else {})}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.num_chunks_sent += 1
                if self.token_delay:
                    await asyncio.sleep(self.token_delay)
            await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.num_disconnects += 1
            raise
        return response


def _error(status: int, message: str, type_: str, code: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "param": None,
                                        "code": code}}, status=status)


StartWorker = Callable[..., Awaitable[FakeWorker]]


@pytest.fixture
async def start_worker() -> AsyncIterator[StartWorker]:
    servers: list[TestServer] = []

    async def start(**kwargs: object) -> FakeWorker:
        worker = FakeWorker(**kwargs)  # type: ignore[arg-type]
        worker.server = TestServer(worker.app())
        await worker.server.start_server()
        worker.url = str(worker.server.make_url("")).rstrip("/")
        servers.append(worker.server)
        return worker

    yield start
    for server in servers:
        await server.close()


@dataclass
class RunningRouter:
    """A router app on a real port, with a client session pointed at it."""

    app: RouterApp
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.app.port}"

    @property
    def state(self):  # type: ignore[no-untyped-def]
        return self.app.router

    def metric(self, name: str, **labels: str) -> float:
        value = self.state.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


StartRouter = Callable[..., Awaitable[RunningRouter]]


@pytest.fixture
async def start_router() -> AsyncIterator[StartRouter]:
    started: list[RunningRouter] = []

    async def start(workers: list[FakeWorker], config: RouterConfig | None = None,
                    wait_healthy: int | None = None, *,
                    debug_headers: bool = True) -> RunningRouter:
        """A router in front of `workers`; it names the worker of each answer
        (`--debug-headers`: what most tests observe) unless `debug_headers` is False."""
        config = config or RouterConfig(probe_interval=0.05)
        config.proxy.debug_headers = debug_headers
        app = build_app(config, StaticDiscovery([w.url for w in workers]))
        await app.start("127.0.0.1", 0)
        router = RunningRouter(app, aiohttp.ClientSession())
        started.append(router)
        want = len(workers) if wait_healthy is None else wait_healthy
        for _ in range(200):
            if len(router.state.pool.healthy()) >= want:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the router never saw its workers healthy")
        return router

    yield start
    for router in started:
        await router.session.close()
        await router.app.stop()
