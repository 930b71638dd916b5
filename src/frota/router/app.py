"""The router's HTTP surface: the OpenAI endpoints, health, readiness and metrics.

`RouterApp` routes requests (served by `frota.router.server`) to its handlers; the
`RouterParts` holds the parts they share: discovery, the worker pool and its health
checks, the policy, admission, the proxy, LoRA adapters and the metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from frota.api.contract import AdmissionDefault, InternalHeader, ServingPath, WorkerPath
from frota.api.fleet_key import Keyring
from frota.router.adapters import AdapterConfig, Adapters
from frota.router.admission import AdmissionController, Rejected
from frota.router.discovery import Discovery
from frota.router.errors import error_response, json_response
from frota.router.health import WorkerPool
from frota.router.hold import Announce, Hold, HoldConfig
from frota.router.metrics import RouterMetrics, merge_processes
from frota.router.policies import (
    LoadSignal,
    PolicyName,
    PrefixAwareConfig,
    RouteRequest,
    make_policy,
)
from frota.router.processes import Siblings, read_sibling_metrics
from frota.router.proxy import Proxy, ProxyConfig, RequestContext
from frota.router.server import Answer, Handler, HttpServer, Limits, Request, Response
from frota.router.upstream import UpstreamClient
from frota.router.validation import refused

log = logging.getLogger(__name__)

OPENAI_POST_PATHS = (ServingPath.COMPLETIONS, ServingPath.CHAT_COMPLETIONS)
PRIORITY_HEADER = "x-priority"
# Client went away; nginx's name for it, so dashboards can tell it from server errors.
STATUS_CLIENT_CLOSED = "499"
METRICS_HEADERS = (("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),)


@dataclass
class RouterConfig:
    """Everything `frota router` can be told (see `frota.router.cli` for the flags)."""

    policy: PolicyName = PolicyName.ROUND_ROBIN
    load_signal: LoadSignal = LoadSignal.OUTSTANDING
    prefix: PrefixAwareConfig = field(default_factory=PrefixAwareConfig)
    session_header: str = "x-session-id"
    max_inflight: int = AdmissionDefault.MAX_INFLIGHT
    max_queue: int = AdmissionDefault.MAX_QUEUE
    queue_timeout: float = AdmissionDefault.QUEUE_TIMEOUT_S
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    probe_interval: float = 1.0
    probe_timeout: float = 2.0
    eject_after: int = 3
    # On SIGTERM: how long requests in flight may run on before they are cut off.
    drain_timeout: float = 30.0
    # The front door (frota.router.server): client connections held at once, and how long
    # one may sit idle, or take none of its answer, before it is closed.
    limits: Limits = field(default_factory=Limits)  # the front door's (frota.router.server)
    api_keys: frozenset[str] = frozenset()
    disagg: Any = None  # frota.router.disagg.PrefillPool: prefill pool + thresholds
    adapters: AdapterConfig = field(default_factory=AdapterConfig)
    # Check completions and chat bodies against the fleet's models (frota.router.validation).
    validate_requests: bool = False
    # Scale to zero: hold requests while no worker is ready, and say so (frota.router.hold).
    hold: HoldConfig = field(default_factory=HoldConfig)
    announce: Announce | None = None
    # Under `--processes N`: this process's siblings, whose metrics its /metrics includes.
    siblings: Siblings | None = None
    # The fleet key (`--fleet-key-file`): the credential of internal calls to workers, and
    # what `/router/workers` asks for. None: no internal calls, and no `/router/workers`
    # unless `proxy.debug_headers`.
    keyring: Keyring | None = None


def read_api_keys(path: str | Path) -> frozenset[str]:
    """One key per line; blank lines and `#` comments are ignored."""
    lines = Path(path).read_text().splitlines()
    keys = frozenset(s for line in lines if (s := line.strip()) and not s.startswith("#"))
    if not keys:
        raise ValueError(f"{path}: no API keys in the file (one per line)")
    return keys


class RouterParts:
    """The parts of one router app, created at start-up and closed at shutdown."""

    def __init__(self, config: RouterConfig, discovery: Discovery) -> None:
        self.config = config
        self.discovery = discovery
        self.metrics = RouterMetrics()
        self.policy = make_policy(config.policy, load_signal=config.load_signal,
                                  prefix=config.prefix, session_header=config.session_header)
        self.admission = AdmissionController(
            self.metrics, max_inflight=config.max_inflight, max_queue=config.max_queue,
            queue_timeout=config.queue_timeout)
        self.adapters = Adapters(config.adapters, self.metrics, config.keyring)
        self.hold = Hold(config.hold, self.metrics, config.announce)
        self.session: aiohttp.ClientSession | None = None
        self.client: UpstreamClient | None = None
        self.pool: WorkerPool | None = None
        self.proxy: Proxy | None = None

    async def start(self) -> None:
        # Requests to workers go through the router's own client (`frota.router.upstream`,
        # no limit on connections: admission bounds what is in flight). Probes, metric
        # scrapes and the Kubernetes API use aiohttp, off the request path. No cookie
        # jar: a worker's cookies must never ride along with the next request.
        self.client = UpstreamClient(connect_timeout=self.config.proxy.connect_timeout,
                                     read_timeout=self.config.proxy.read_timeout)
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        self.pool = WorkerPool(
            self.session, self.metrics, probe_interval=self.config.probe_interval,
            probe_timeout=self.config.probe_timeout, eject_after=self.config.eject_after,
            scrape_metrics=self.policy.needs_worker_metrics)
        self.adapters.session = self.hold.session = self.session
        self.adapters.attach(self.pool)
        self.proxy = Proxy(self.client, self.pool, self.policy, self.metrics, self.config.proxy)
        await self.discovery.start(self.session, self.pool.set_urls)
        if self.config.disagg is not None:
            await self.config.disagg.start(
                self.proxy, self.session, self.config.probe_interval,
                self.config.probe_timeout, self.config.eject_after, self.adapters.attach)

    async def close(self) -> None:
        await self.hold.close()
        if self.config.disagg is not None:
            await self.config.disagg.stop()
        await self.discovery.stop()
        if self.pool is not None:
            await self.pool.close()
        if self.client is not None:
            await self.client.close()
        if self.session is not None:
            await self.session.close()


class RouterApp:
    """The router's endpoints on its HTTP server; `start` listens, `stop` shuts down."""

    def __init__(self, config: RouterConfig, discovery: Discovery) -> None:
        self.router = RouterParts(config, discovery)
        self.server: HttpServer | None = None
        self.private: HttpServer | None = None  # for siblings: this process's own metrics
        self.port = 0
        self._keys = [k.encode() for k in config.api_keys]
        proxied = {"POST": self._proxied}
        self.routes: dict[str, dict[str, Handler]] = {
            **{path: proxied for path in OPENAI_POST_PATHS},
            ServingPath.MODELS: {"GET": self._models},
            ServingPath.HEALTH: {"GET": self._health},
            ServingPath.READY: {"GET": self._ready},
            ServingPath.METRICS: {"GET": self._metrics},
            "/router/workers": {"GET": self._workers},
        }
        if config.adapters.runtime_loading:  # else 404, as from vLLM's server
            self.routes[WorkerPath.LOAD_LORA_ADAPTER] = {"POST": self._load_adapter}
            self.routes[WorkerPath.UNLOAD_LORA_ADAPTER] = {"POST": self._unload_adapter}

    async def start(self, host: str, port: int, *, backlog: int = 2048,
                    reuse_port: bool = False) -> int:
        """Start discovery and health checks, then listen; returns the port. With
        `reuse_port`, several router processes can listen on the same port."""
        await self.router.start()
        config = self.router.config
        metrics = self.router.metrics
        self.server = server = HttpServer(
            self.handle, config.limits,
            on_cut=lambda reason: metrics.connections_cut.labels(reason).inc())
        metrics.connections.add_reader(lambda: [((), len(server.connections))])
        self.port = await self.server.listen(host, port, backlog=backlog,
                                             reuse_port=reuse_port)
        siblings = self.router.config.siblings
        if siblings is not None:
            self.private = HttpServer(self._own_metrics)
            await self.private.listen_unix(siblings.socket(siblings.index))
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.close(grace=self.router.config.drain_timeout)
        if self.private is not None:
            await self.private.close(grace=1.0)
        await self.router.close()

    def handle(self, request: Request) -> Awaitable[Answer]:
        """The server's handler: the route's own coroutine, awaited by the server itself
        (not wrapped in one more, which each resumption of the request would pass through)."""
        methods = self.routes.get(request.path)
        if methods is None:
            return _answered(error_response(404, f"no such endpoint: {request.path}",
                                            "invalid_request_error", "not_found"))
        handler = methods.get(request.method)
        if handler is None:
            return _answered(error_response(
                405, f"{request.method} is not allowed on {request.path}",
                "invalid_request_error", "method_not_allowed",
                headers={"Allow": ", ".join(methods)}))
        if self._keys and request.path.startswith("/v1/"):  # health and metrics stay open
            refused = self._check_key(request)
            if refused is not None:
                return _answered(refused)
        return handler(request)

    def _fleet_only(self, request: Request) -> Response | None:
        """None when `request` may see the fleet's inside (worker addresses): it carries the
        fleet's credential, or the router runs with `--debug-headers`; else the 403."""
        config = self.router.config
        if config.proxy.debug_headers or (
                config.keyring is not None
                and config.keyring.accepts_authorization(request.headers.get("authorization"))):
            return None
        return error_response(403, f"{request.path} is internal to the fleet",
                              "permission_error", "forbidden")

    def _check_key(self, request: Request) -> Response | None:
        """Bearer-token check; None when the key is one of the configured ones."""
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
        if any(hmac.compare_digest(token, k) for k in self._keys):
            return None
        message = ("missing API key: send 'Authorization: Bearer <key>'" if not token
                   else "incorrect API key provided")
        return error_response(401, message, "invalid_request_error", "invalid_api_key")

    async def _proxied(self, request: Request) -> Answer:
        router = self.router
        started = time.perf_counter()
        endpoint = request.path
        route = RouteRequest(request.path, request.body, request.headers)
        invalid = refused(endpoint, request.body) if router.config.validate_requests else None
        if invalid is None and router.policy.needs_body and request.body and not route.json:
            invalid = error_response(400, "the request body is not a JSON object",
                                     "invalid_request_error", "invalid_json")
        if invalid is not None:
            router.metrics.requests.labels(endpoint, "400").inc()
            return invalid
        router.metrics.last_request_at = time.time()
        assert router.proxy is not None
        held = None if router.proxy.pool.healthy() else await router.hold.until_serving(
            router.proxy.pool)
        if held is not None:
            router.metrics.requests.labels(endpoint, str(held.status)).inc()
            return held
        status = STATUS_CLIENT_CLOSED
        request_id = router.proxy.ids.next()
        if not router.admission.try_acquire():
            try:
                priority = int(request.headers.get(PRIORITY_HEADER, "0"))
            except ValueError:
                priority = 0
            try:
                await router.admission.acquire(priority)
            except Rejected as exc:
                router.metrics.requests.labels(endpoint, "429").inc()
                return error_response(
                    429, f"the router is at capacity ({exc.reason}); retry after "
                    f"{exc.retry_after}s", "rate_limit_exceeded", exc.reason,
                    headers={"Retry-After": str(exc.retry_after),
                             InternalHeader.REQUEST_ID: request_id})
        try:
            assert router.proxy is not None
            adapters = router.adapters
            # Only a fleet with adapters reads the body's `model` (one test otherwise).
            if adapters.names and (adapter := adapters.requested(route)) is not None:
                route.adapter = adapter
                pool = router.proxy.pool
                if adapters.should_load(adapter, pool.healthy()):
                    await adapters.ensure_loaded(adapter, pool)
            ctx = RequestContext(request, route, started, request_id)
            response = await router.proxy.plan_for(ctx).execute(ctx)
            if (response.status in (502, 503) and isinstance(response, Response)
                    and not router.proxy.pool.healthy() and router.config.hold.seconds > 0):
                # Its workers went away before the first byte (a fleet scaling to zero):
                # held like a request that arrived now, then routed again.
                held = await router.hold.until_serving(router.proxy.pool)
                response = held or await router.proxy.plan_for(ctx).execute(ctx)
            if not request.client_gone:
                status = str(response.status)
            return response
        finally:  # also when the client left (the task is cancelled): 499
            router.admission.release()
            router.metrics.requests.labels(endpoint, status).inc()
            router.metrics.request_latency.labels(endpoint).observe(
                time.perf_counter() - started)

    async def _models(self, request: Request) -> Answer:
        """A worker's `/v1/models`, plus the adapters only other workers hold."""
        response = await self._proxied(request)
        if (not self.router.adapters.names or response.status != 200
                or not isinstance(response, Response)):
            return response
        try:
            payload = json.loads(response.body)
        except (ValueError, TypeError):
            return response
        if not self.router.adapters.merge_models(payload):
            return response
        headers = {k: v for k, v in response.headers if k.lower() != "content-type"}
        return json_response(payload, headers=headers)

    async def _load_adapter(self, request: Request) -> Response:
        body = _json_object(request.body)
        return body if isinstance(body, Response) else await self.router.adapters.load(body)

    async def _unload_adapter(self, request: Request) -> Response:
        body = _json_object(request.body)
        if isinstance(body, Response):
            return body
        return await self.router.adapters.unload(body)

    async def _health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def _ready(self, request: Request) -> Response:
        """Ready with a worker in rotation; with a hold time, ready without one too: a
        fleet at zero replicas reaches its workers through this router, which holds the
        request and calls a replica back (a router out of its Service's endpoints would
        leave the client nothing to connect to, and a new router pod could never roll out)."""
        pool = self.router.pool
        num_healthy = len(pool.healthy()) if pool else 0
        if num_healthy:
            return json_response({"status": "ready", "healthy_workers": num_healthy})
        if self.router.config.hold.seconds > 0:
            return json_response({"status": "holding", "healthy_workers": 0})
        return error_response(503, "no healthy worker yet", "service_unavailable",
                              "no_healthy_workers", headers={"Retry-After": "1"})

    async def _metrics(self, request: Request) -> Response:
        """This process's metrics; under `--processes`, every process's, each sample
        labelled with its process (a sibling that does not answer is left out)."""
        own = self.router.metrics.render()
        siblings = self.router.config.siblings
        if siblings is not None:
            others = siblings.others
            answers = await asyncio.gather(
                *(read_sibling_metrics(siblings.socket(i)) for i in others))
            texts = {i: text for i, text in zip(others, answers, strict=True) if text}
            own = merge_processes({siblings.index: own.decode(), **texts})
        return Response(200, own, METRICS_HEADERS)

    async def _own_metrics(self, request: Request) -> Response:
        """What a sibling reads on this process's Unix socket."""
        if request.path != ServingPath.METRICS:
            return error_response(404, f"no such endpoint: {request.path}",
                                  "invalid_request_error", "not_found")
        return Response(200, self.router.metrics.render(), METRICS_HEADERS)

    async def _workers(self, request: Request) -> Response:
        """The router's view of its workers (for people and tests): their addresses, so only
        for the fleet's own callers (`_fleet_only`)."""
        refused = self._fleet_only(request)
        if refused is not None:
            return refused
        router = self.router
        workers = router.pool.workers.values() if router.pool else []
        return json_response({"policy": router.policy.name.value, "workers": [
            {"url": w.url, "healthy": w.is_healthy, "outstanding": w.num_outstanding,
             "consecutive_failures": w.num_consecutive_failures,
             **({"adapters": sorted(w.adapters), "max_lora": w.lora.max_lora}
                if w.lora is not None else {})} for w in workers]})


def _json_object(body: bytes) -> dict[str, Any] | Response:
    """`body` as a JSON object, or the 400 that says it is not one."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return error_response(400, "the request body is not a JSON object",
                          "invalid_request_error", "invalid_json")


def build_app(config: RouterConfig, discovery: Discovery) -> RouterApp:
    """The router app; `await app.start(host, port)` opens it."""
    return RouterApp(config, discovery)


async def _answered(answer: Answer) -> Answer:
    """An answer already made, as the awaitable `RouterApp.handle` returns."""
    return answer
