"""The router's HTTP surface: the OpenAI endpoints, health, readiness and metrics."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from frota.router.admission import AdmissionController, Rejected
from frota.router.discovery import Discovery
from frota.router.errors import error_response
from frota.router.health import WorkerPool
from frota.router.metrics import RouterMetrics
from frota.router.policies import LoadSignal, PolicyName, RouteRequest, make_policy
from frota.router.proxy import Proxy, ProxyConfig, RequestContext

log = logging.getLogger(__name__)

OPENAI_POST_PATHS = ("/v1/completions", "/v1/chat/completions")
PRIORITY_HEADER = "x-priority"
# Client went away; nginx's name for it, so dashboards can tell it from server errors.
STATUS_CLIENT_CLOSED = "499"


@dataclass
class RouterConfig:
    """Everything `frota router` can be told (see `frota.router.cli` for the flags)."""

    policy: PolicyName = PolicyName.ROUND_ROBIN
    load_signal: LoadSignal = LoadSignal.OUTSTANDING
    prefix_block_chars: int = 128
    prefix_max_blocks: int = 64
    prefix_balance: float = 0.25
    session_header: str = "x-session-id"
    max_inflight: int = 256
    max_queue: int = 1024
    queue_timeout: float = 30.0
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    probe_interval: float = 1.0
    probe_timeout: float = 2.0
    eject_after: int = 3
    api_keys: frozenset[str] = frozenset()
    disagg: Any = None  # frota.router.disagg.Disaggregation: prefill pool + thresholds


def read_api_keys(path: str | Path) -> frozenset[str]:
    """One key per line; blank lines and `#` comments are ignored."""
    lines = Path(path).read_text().splitlines()
    keys = frozenset(s for line in lines if (s := line.strip()) and not s.startswith("#"))
    if not keys:
        raise ValueError(f"{path}: no API keys in the file (one per line)")
    return keys


class Router:
    """The parts of one router app, created at start-up and closed at shutdown."""

    def __init__(self, config: RouterConfig, discovery: Discovery) -> None:
        self.config = config
        self.discovery = discovery
        self.metrics = RouterMetrics()
        self.policy = make_policy(
            config.policy, load_signal=config.load_signal,
            prefix_block_chars=config.prefix_block_chars,
            prefix_max_blocks=config.prefix_max_blocks, prefix_balance=config.prefix_balance,
            session_header=config.session_header)
        self.admission = AdmissionController(
            self.metrics, max_inflight=config.max_inflight, max_queue=config.max_queue,
            queue_timeout=config.queue_timeout)
        self.session: aiohttp.ClientSession | None = None
        self.pool: WorkerPool | None = None
        self.proxy: Proxy | None = None

    async def start(self) -> None:
        # Admission bounds the in-flight requests; the connector must not add a second,
        # hidden queue (aiohttp's default is 100 connections).
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=True)
        # Bytes pass through as the worker sent them; asking for identity keeps them plain.
        # No cookie jar: a proxy must not carry one worker's cookies to the next request
        # (and skipping the jar saves work on every request).
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                             cookie_jar=aiohttp.DummyCookieJar(),
                                             headers={"Accept-Encoding": "identity"})
        self.pool = WorkerPool(
            self.session, self.metrics, probe_interval=self.config.probe_interval,
            probe_timeout=self.config.probe_timeout, eject_after=self.config.eject_after,
            scrape_metrics=self.policy.needs_worker_metrics)
        self.proxy = Proxy(self.session, self.pool, self.policy, self.metrics, self.config.proxy)
        await self.discovery.start(self.session, self.pool.set_urls)
        if self.config.disagg is not None:
            await self.config.disagg.start(self.proxy, self.config.probe_interval,
                                           self.config.probe_timeout, self.config.eject_after)

    async def close(self) -> None:
        if self.config.disagg is not None:
            await self.config.disagg.stop()
        await self.discovery.stop()
        if self.pool is not None:
            await self.pool.close()
        if self.session is not None:
            await self.session.close()


ROUTER_KEY = web.AppKey("router", Router)


def build_app(config: RouterConfig, discovery: Discovery) -> web.Application:
    """The router as an aiohttp app; start-up opens the session and starts discovery."""
    router = Router(config, discovery)
    middlewares = [_errors_middleware]
    if config.api_keys:  # one layer less on every request when there is nothing to check
        middlewares.append(_auth_middleware(config.api_keys))
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
    app[ROUTER_KEY] = router

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        await router.start()
        yield
        await router.close()

    app.cleanup_ctx.append(lifecycle)
    for path in OPENAI_POST_PATHS:
        app.router.add_post(path, _proxied)
    app.router.add_get("/v1/models", _proxied)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/router/workers", _workers)
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown paths and methods answer in the OpenAI error shape, like the workers."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(404, f"no such endpoint: {request.path}",
                              "invalid_request_error", "not_found")
    except web.HTTPMethodNotAllowed:
        return error_response(405, f"{request.method} is not allowed on {request.path}",
                              "invalid_request_error", "method_not_allowed")
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, "request body too large", "invalid_request_error",
                              "request_too_large")


def _auth_middleware(api_keys: frozenset[str]):  # type: ignore[no-untyped-def]
    """Bearer-token check on the OpenAI endpoints; health and metrics stay open."""
    encoded = [k.encode() for k in api_keys]

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            auth = request.headers.get("Authorization", "")
            token = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
            if not any(hmac.compare_digest(token, k) for k in encoded):
                message = ("missing API key: send 'Authorization: Bearer <key>'" if not token
                           else "incorrect API key provided")
                return error_response(401, message, "invalid_request_error", "invalid_api_key")
        return await handler(request)

    return check


async def _proxied(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    started = time.perf_counter()
    endpoint = request.path
    body = await request.read()
    route = RouteRequest(request.path, body, request.headers)
    if router.policy.needs_body and body and not route.json:
        router.metrics.requests.labels(endpoint, "400").inc()
        return error_response(400, "the request body is not a JSON object",
                              "invalid_request_error", "invalid_json")
    try:
        priority = int(request.headers.get(PRIORITY_HEADER, "0"))
    except ValueError:
        priority = 0
    status = STATUS_CLIENT_CLOSED
    try:
        await router.admission.acquire(priority)
    except Rejected as exc:
        router.metrics.requests.labels(endpoint, "429").inc()
        return error_response(
            429, f"the router is at capacity ({exc.reason}); retry after "
            f"{exc.retry_after}s", "rate_limit_exceeded", exc.reason,
            headers={"Retry-After": str(exc.retry_after)})
    try:
        assert router.proxy is not None
        ctx = RequestContext(request, route, started)
        response = await router.proxy.plan_for(ctx).execute(ctx)
        status = str(response.status)
        return response
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        return web.Response(status=499)  # the client is gone; nobody reads this
    finally:
        router.admission.release()
        router.metrics.requests.labels(endpoint, status).inc()
        router.metrics.request_latency.labels(endpoint).observe(time.perf_counter() - started)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    num_healthy = len(router.pool.healthy()) if router.pool else 0
    if num_healthy:
        return web.json_response({"status": "ready", "healthy_workers": num_healthy})
    return error_response(503, "no healthy worker yet", "service_unavailable",
                          "no_healthy_workers", headers={"Retry-After": "1"})


async def _metrics(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    return web.Response(body=router.metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _workers(request: web.Request) -> web.Response:
    """The router's view of its workers (for people and tests)."""
    router = request.app[ROUTER_KEY]
    workers = router.pool.workers.values() if router.pool else []
    return web.json_response({"policy": router.policy.name.value, "workers": [
        {"url": w.url, "healthy": w.is_healthy, "outstanding": w.num_outstanding,
         "consecutive_failures": w.num_consecutive_failures} for w in workers]})
