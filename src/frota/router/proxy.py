"""Forwarding a request to workers: route plans, retries, streaming passthrough.

A `RoutePlan` is how one admitted request travels through the fleet. `DirectPlan`:
the policy picks a worker, the request is forwarded, and a failure before the
first byte reaches the client is retried on another worker. The disaggregated plan
(prefill worker, then decode worker with a KV handle, `frota.router.disagg`) is
built from the same `Proxy` primitives (`attempt` to open an upstream response,
`relay_stream` to pass it on), without touching the app.

Streams are relayed as raw bytes, chunk by chunk as they arrive: the router
never parses or re-serializes SSE events, and a chunk goes from the worker's
connection to the client's in one callback (`frota.router.upstream`,
`frota.router.server.ResponseStream`). Non-streaming bodies are read whole before
the client sees anything, which makes them retryable as a whole.

The router is where the outside ends (docs/security.md). A worker sees only the client's
headers it needs (`FORWARDED_REQUEST_HEADERS`; never one named in the request's
`Connection`, never an `x-frota-*` one), then the router's own: the request's id and,
on the fleet's internal calls, the fleet's credential. A client sees the worker's answer
without its internal headers, and of a worker's failure (a 5xx) only that it failed and
the request's id: the worker's words go to the router's log under that id.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from frota.api.contract import InternalHeader
from frota.router.errors import error_body, error_response, sse_error_event
from frota.router.health import Worker, WorkerPool
from frota.router.metrics import RouterMetrics
from frota.router.policies import RouteRequest, RoutingPolicy
from frota.router.server import Answer, Request, Response, open_stream
from frota.router.upstream import UpstreamClient, UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

# The only headers of a client's request a worker sees (an allowlist: whatever the fleet
# uses inside, today's `x-frota-*` and tomorrow's, cannot be sent from outside). The body's
# type, what the client accepts, who it is for the logs, and the trace context.
FORWARDED_REQUEST_HEADERS = frozenset({
    "content-type", "accept", "user-agent", "traceparent", "tracestate",
})
# Hop-by-hop and the router's own: never passed from a worker's answer to the client.
DROP_RESPONSE_HEADERS = frozenset({
    "content-length", "transfer-encoding", "connection", "keep-alive", "date", "server",
    InternalHeader.REQUEST_ID,
})
# Worker answers that mean "try another replica" (nothing was generated).
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Bytes pass through as the worker sent them; asking for identity keeps them plain.
IDENTITY = "Accept-Encoding: identity"


@dataclass
class ProxyConfig:
    """Retry and timeout settings of the proxy."""

    max_retries: int = 2            # attempts beyond the first, each on another worker
    retry_backoff: float = 0.02     # seconds before the first retry; doubles each time
    connect_timeout: float = 3.0
    read_timeout: float | None = 600.0  # longest silence from a worker mid-response
    debug_headers: bool = False     # name the worker in each answer (`x-frota-worker`)


class RetryableFailure(Exception):
    """An attempt failed before its first byte reached the client."""

    def __init__(self, reason: str, response: Response | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.response = response  # the worker's own answer, passed on if retries run out


@dataclass(slots=True)
class RequestContext:
    """One client request on its way through the router."""

    request: Request
    route: RouteRequest
    started: float  # time.perf_counter() when the router received it
    request_id: str  # in the client's answer and the worker's request, and in log lines


class RequestIds:
    """Ids for requests: a random prefix per process and a counter, unique across router
    processes and restarts without a system call per request."""

    def __init__(self) -> None:
        self._prefix = f"req_{secrets.token_hex(6)}"
        self._count = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):08x}"


def forwarded_lines(ctx: RequestContext) -> list[str]:
    """The header lines a worker should see: the client's allowed ones, as sent (none that
    its `Connection` header names), `IDENTITY` and the request's id."""
    headers = ctx.request.headers
    kept = [line for line, name in zip(headers.lines, headers.names, strict=True)
            if name in FORWARDED_REQUEST_HEADERS]
    if "connection" in headers.first:  # rare: the names it lists stop at this hop
        hop = {token.strip().lower() for value in headers.getall("connection")
               for token in value.split(",")}
        kept = [line for line in kept if line.partition(":")[0].strip().lower() not in hop]
    kept.append(IDENTITY)
    kept.append(f"X-Request-Id: {ctx.request_id}")
    return kept


class Proxy:
    """The primitives route plans are made of; one per app, sharing one `UpstreamClient`."""

    def __init__(self, client: UpstreamClient, pool: WorkerPool, policy: RoutingPolicy,
                 metrics: RouterMetrics, config: ProxyConfig) -> None:
        self.client = client
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.config = config
        self.disagg = None  # frota.router.disagg.PrefillPool, when prefill workers exist
        self._policy_name = policy.name.value
        self.direct = DirectPlan(self)  # holds no request state: one serves them all
        self.ids = RequestIds()

    def plan_for(self, ctx: RequestContext) -> RoutePlan:
        if self.disagg is not None:
            return self.disagg.plan_for(self, ctx)
        return self.direct

    def pick(self, ctx: RequestContext, exclude: set[str]) -> Worker | None:
        """Ask the policy for a healthy worker this request has not failed on. A request
        for a LoRA adapter goes only to workers that hold it, when any does (retries too:
        another worker would refuse it); else to any (`frota.router.adapters`)."""
        candidates = self.pool.healthy()
        adapter = ctx.route.adapter
        if adapter is not None:
            candidates = [w for w in candidates if adapter in w.adapters] or candidates
        if exclude:  # a retry
            candidates = [w for w in candidates if w.url not in exclude]
        if not candidates:
            return None
        decision = self.policy.choose(ctx.route, candidates)
        self.metrics.decisions.labels(self._policy_name, decision.reason,
                                      decision.worker.url).inc()
        return decision.worker

    async def attempt(self, worker: Worker, ctx: RequestContext, *,
                      extra_headers: Sequence[tuple[str, str]] = (),
                      only_200: bool = False) -> UpstreamResponse:
        """Send the request to `worker`; return its response once the headers say it
        is going ahead. Raise `RetryableFailure` when another worker (or, for a decode
        stage, another plan) should try: on a connect failure, on a status in
        `RETRY_STATUSES`, and with `only_200` on any status but 200. Other statuses
        are the request's own answer (a 400 is the client's problem) and go ahead.
        A 5xx counts against the worker's health; a 429 (a full queue) does not."""
        request = ctx.request
        sent = time.perf_counter()
        try:
            upstream = await self.client.request(
                worker.url, request.method, request.target, extra_headers, ctx.route.body,
                lines=forwarded_lines(ctx))
        except UpstreamError as exc:
            # Refused: nothing listens there (stopped, scaled to zero): out of rotation now,
            # not after `eject_after` more requests fail on it; its probe brings it back.
            refused = isinstance(exc.__cause__, ConnectionRefusedError)
            self.pool.record_failure(worker, f"request: {exc}", eject_now=refused)
            raise RetryableFailure(exc.reason) from exc
        self.metrics.upstream_latency.labels(worker.url).observe(time.perf_counter() - sent)
        status = upstream.status
        if status in RETRY_STATUSES or (only_200 and status != 200):
            try:
                body = await upstream.read()
            except UpstreamError:
                body = b""
            finally:
                upstream.close()
            if status >= 500:
                self.pool.record_failure(worker, f"answered {status}", eject_now=status == 503)
                response = self.failure_answer(upstream, worker, ctx, body)
            else:
                response = Response(status, body, self.response_headers(upstream, worker, ctx))
            raise RetryableFailure(f"status_{status}", response)
        return upstream

    async def respond(self, upstream: UpstreamResponse, worker: Worker,
                      ctx: RequestContext) -> Answer:
        """The client's answer from an attempt that went ahead: a stream relayed as it
        comes, anything else read whole. Raise `RetryableFailure` when nothing has
        reached the client yet."""
        try:
            if upstream.content_type == "text/event-stream":
                return await self.relay_stream(upstream, worker, ctx)
            return await self.read_whole(upstream, worker, ctx)
        finally:
            upstream.close()  # no-op when fully read; cuts the worker off otherwise

    async def read_whole(self, upstream: UpstreamResponse, worker: Worker,
                         ctx: RequestContext) -> Response:
        """Read a non-streaming answer whole; a failure is still retryable."""
        try:
            body = await upstream.read()
        except UpstreamError as exc:
            self.pool.record_failure(worker, f"body: {exc}")
            raise RetryableFailure("disconnected") from exc
        self.pool.record_success(worker)
        if upstream.status >= 500:
            return self.failure_answer(upstream, worker, ctx, body)
        return Response(upstream.status, body, self.response_headers(upstream, worker, ctx))

    def response_headers(self, upstream: UpstreamResponse, worker: Worker,
                         ctx: RequestContext) -> list[tuple[str, str]]:
        """The worker's headers the client may see, and the request's id."""
        headers = [h for h, name in zip(upstream.headers, upstream.names, strict=True)
                   if name not in DROP_RESPONSE_HEADERS
                   and not name.startswith(InternalHeader.PREFIX)]
        headers.append((InternalHeader.REQUEST_ID, ctx.request_id))
        if self.config.debug_headers:
            headers.append((InternalHeader.WORKER, worker.url))
        return headers

    def failure_answer(self, upstream: UpstreamResponse, worker: Worker, ctx: RequestContext,
                       body: bytes) -> Response:
        """A worker's 5xx as the client sees it: its status (and Retry-After), an OpenAI error
        that names the request's id and nothing of the fleet; what the worker said goes to
        the log under that id."""
        status = upstream.status
        log.warning("request %s: %s answered %d: %s", ctx.request_id, worker.url, status,
                    body[:500])
        retry_after = next((v for (n, v), name in zip(upstream.headers, upstream.names,
                                                      strict=True)
                            if name == "retry-after"), None)
        headers = [("Content-Type", "application/json; charset=utf-8"),
                   (InternalHeader.REQUEST_ID, ctx.request_id)]
        if retry_after is not None:
            headers.append(("Retry-After", retry_after))
        if self.config.debug_headers:
            headers.append((InternalHeader.WORKER, worker.url))
        message = (f"the worker serving this request failed (status {status}); retry the "
                   f"request, and quote request id {ctx.request_id} when reporting it")
        return Response(status, json.dumps(error_body(
            message, "server_error", "upstream_error")).encode(), headers)

    async def relay_stream(self, upstream: UpstreamResponse, worker: Worker,
                           ctx: RequestContext) -> Answer:
        """Pass a streaming answer through chunk by chunk.

        The first chunk is awaited before the client's response starts, so a worker
        that dies before producing anything is retryable. After that each chunk goes
        to the client from the upstream connection's callback, and a worker failure
        ends the stream with an OpenAI error event.
        """
        try:
            first = await upstream.next_chunk()
        except UpstreamError as exc:
            self.pool.record_failure(worker, f"stream: {exc}")
            raise RetryableFailure("disconnected") from exc
        if not first:
            self.pool.record_failure(worker, "empty stream")
            raise RetryableFailure("empty_stream")
        self.pool.record_success(worker)
        stream = open_stream(ctx.request, upstream.status,
                             self.response_headers(upstream, worker, ctx), first)
        self.metrics.ttft.observe(time.perf_counter() - ctx.started)
        stream.time_gaps(self.metrics.itl.labels())
        stream.set_flow_control(upstream.pause_reading, upstream.resume_reading)
        ended_raw = False
        try:
            # Once at a chunk boundary, a chunked body goes to the client as it came.
            ended_raw = await upstream.relay(stream.write,
                                            stream.write_raw if stream.chunked else None)
        except UpstreamError as exc:
            self.metrics.stream_errors.inc()
            self.pool.record_failure(worker, f"mid-stream: {exc}")
            log.warning("request %s: the stream from %s broke after its first byte: %s",
                        ctx.request_id, worker.url, exc)
            if exc.mid_chunk:  # part of a chunk went out: no event can follow it
                stream.cut()
                return stream
            stream.time_gaps(None)  # the error event is not a token
            stream.write(sse_error_event(
                f"the worker serving this stream failed ({exc.reason}); the response is "
                f"incomplete, retry the request (request id {ctx.request_id})"))
        stream.end(ended_raw=ended_raw)
        return stream


class RoutePlan(ABC):
    """How one request travels through the fleet (direct today; prefill/decode later)."""

    @abstractmethod
    async def execute(self, ctx: RequestContext) -> Answer:
        """Serve `ctx` and return the response (already written when streamed)."""


class DirectPlan(RoutePlan):
    """One worker serves the whole request; failures before the first byte move it to
    another worker, at most `max_retries` times, with jittered exponential backoff."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def execute(self, ctx: RequestContext) -> Answer:
        proxy, config = self.proxy, self.proxy.config
        tried: set[str] = set()
        failure: RetryableFailure | None = None
        for attempt in range(config.max_retries + 1):
            worker = proxy.pick(ctx, tried)
            if worker is None:
                break
            if failure is not None:
                proxy.metrics.retries.labels(failure.reason).inc()
                delay = config.retry_backoff * (2 ** (attempt - 1))
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            tried.add(worker.url)
            worker.num_outstanding += 1  # what policies balance by, and its gauge reads
            try:
                return await proxy.respond(await proxy.attempt(worker, ctx), worker, ctx)
            except RetryableFailure as exc:
                failure = exc
                log.info("request %s: attempt %d on %s failed before the first byte: %s",
                         ctx.request_id, attempt + 1, worker.url, exc.reason)
            finally:
                worker.num_outstanding -= 1
        if failure is not None and failure.response is not None:
            return failure.response  # every worker said 429/503: pass the last answer on
        ids = {InternalHeader.REQUEST_ID: ctx.request_id}
        if failure is not None:
            return error_response(
                502, f"no worker could serve the request ({failure.reason} on "
                f"{len(tried)} worker(s)); retry later", "upstream_error", "upstream_unavailable",
                headers={"Retry-After": "1", **ids})
        return error_response(
            503, "no healthy worker is available; the fleet may be starting or scaling",
            "service_unavailable", "no_healthy_workers", headers={"Retry-After": "1", **ids})
