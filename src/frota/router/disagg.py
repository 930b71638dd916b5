"""Disaggregated prefill/decode in the router: a `RoutePlan` over a prefill pool and the decode pool.

`DisaggPlan`: the prefill pool runs the prompt (`POST /internal/kv/prefill/v1/...` on a
prefill worker, which answers with the first token and a KV handle); then the request
goes to a decode worker (the router's main pool, where `--workers` and
`--decode-workers` live) with the handle in the `x-frota-kv-handle` header; the decode
worker pulls the blocks and streams the answer, relayed as usual.

A request stays colocated (straight to the main pool, `DirectPlan`) when:
- its prompt is estimated shorter than `--disagg-min-prompt-tokens` (moving the KV
  would cost more than the prefill it saves). The router has no tokenizer: it
  estimates tokens as characters / 4 (token-id prompts are counted exactly);
- it cannot be split: several prompts, `n` > 1, or logprobs (the first token's
  logprobs stay on the prefill worker);
- anything on the way fails: no prefill worker, the prefill fails, the decode worker
  cannot pull the KV (409 layout mismatch, 424 prefill peer gone, 403 a handle signed
  with a key it does not know yet, mid-rotation), or the decode worker fails before its
  first byte. The request then runs colocated; nothing has reached the client yet, so the
  client sees one normal answer.

The prefill call and the handle drop carry the fleet's credential (`frota.api.fleet_key`);
the handle is signed by the prefill worker, and re-signed here when the router fills in the
URL it reached that worker at. Disaggregation therefore needs the router's `--fleet-key-file`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from frota.api.contract import InternalHeader, RouterMetric, ServingPath, WorkerPath
from frota.api.fleet_key import Keyring
from frota.router.discovery import Discovery
from frota.router.health import Worker, WorkerPool
from frota.router.loop_metrics import Counter, Histogram
from frota.router.proxy import (
    Proxy,
    RequestContext,
    RetryableFailure,
    RoutePlan,
    forwarded_lines,
)
from frota.router.server import Answer
from frota.router.upstream import UpstreamError

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
DISAGG_PATHS = (ServingPath.COMPLETIONS, ServingPath.CHAT_COMPLETIONS)
PREFILL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class DisaggConfig:
    """Disaggregation settings of the router (`--prefill-workers`, `--disagg-min-prompt-tokens`)."""

    min_prompt_tokens: int = 256
    prefill_timeout: float = 600.0


def estimate_prompt_tokens(path: str, body: Any) -> int | None:
    """Prompt tokens of a request body, estimated; None when it cannot be disaggregated."""
    if not isinstance(body, dict):
        return None
    n = body.get("n")
    if n not in (None, 1) or body.get("best_of") not in (None, 1):
        return None
    if path == ServingPath.COMPLETIONS:
        if body.get("logprobs") is not None:
            return None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return len(prompt) // CHARS_PER_TOKEN
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        return None
    if path == ServingPath.CHAT_COMPLETIONS:
        if body.get("logprobs"):
            return None
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        chars = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
        return chars // CHARS_PER_TOKEN
    return None


class DisaggMetrics:
    """The disaggregation metrics (names in RouterMetric), on the router's registry."""

    def __init__(self, registry: Any) -> None:
        self.requests = Counter(
            RouterMetric.DISAGG_REQUESTS, "Requests by how they were served: disaggregated, "
            "colocated_short, colocated_ineligible, colocated_fallback.", ["route"],
            registry=registry)
        self.fallbacks = Counter(
            RouterMetric.DISAGG_FALLBACKS, "Disaggregated attempts that ran colocated "
            "instead, by reason.", ["reason"], registry=registry)
        self.prefill_latency = Histogram(
            RouterMetric.PREFILL_LATENCY_SECONDS, "Prefill stage: request to KV handle.",
            buckets=PREFILL_BUCKETS, registry=registry)
        self.handoff_latency = Histogram(
            RouterMetric.KV_HANDOFF_SECONDS, "Decode stage until its response headers "
            "(the KV transfer plus admission).", buckets=PREFILL_BUCKETS, registry=registry)


class PrefillPool:
    """The prefill pool plus what the plan needs; one per router app."""

    def __init__(self, config: DisaggConfig, prefill_discovery: Discovery,
                 keyring: Keyring) -> None:
        self.config = config
        self.discovery = prefill_discovery
        self.keyring = keyring
        self.pool: WorkerPool | None = None
        self.metrics: DisaggMetrics | None = None
        self.session: aiohttp.ClientSession | None = None
        self._next = 0

    async def start(self, proxy: Proxy, session: aiohttp.ClientSession, probe_interval: float,
                    probe_timeout: float, eject_after: int,
                    attach: Callable[[WorkerPool], None] | None = None) -> None:
        """`session` is the router's aiohttp session, for probes, discovery and handle
        drops; `attach` sees the prefill pool before its discovery starts (adapters)."""
        self.metrics = DisaggMetrics(proxy.metrics.registry)
        self.session = session
        self.pool = WorkerPool(session, proxy.metrics, probe_interval=probe_interval,
                               probe_timeout=probe_timeout, eject_after=eject_after)
        if attach is not None:
            attach(self.pool)
        await self.discovery.start(session, self.pool.set_urls)
        proxy.disagg = self

    async def stop(self) -> None:
        await self.discovery.stop()
        if self.pool is not None:
            await self.pool.close()

    def pick_prefill(self, adapter: str | None = None) -> Worker | None:
        """The healthy prefill worker with the fewest requests in flight (ties rotate);
        for a LoRA adapter, among those that hold it when any does."""
        healthy = self.pool.healthy() if self.pool else []
        if adapter is not None:
            healthy = [w for w in healthy if adapter in w.adapters] or healthy
        if not healthy:
            return None
        self._next += 1
        order = healthy[self._next % len(healthy):] + healthy[:self._next % len(healthy)]
        return min(order, key=lambda w: w.num_outstanding)

    def plan_for(self, proxy: Proxy, ctx: RequestContext) -> RoutePlan:
        assert self.metrics is not None
        estimate = None
        if ctx.request.method == "POST" and ctx.route.path in DISAGG_PATHS:
            estimate = estimate_prompt_tokens(ctx.route.path, ctx.route.json)
        if estimate is None:
            self.metrics.requests.labels("colocated_ineligible").inc()
            return proxy.direct
        if estimate < self.config.min_prompt_tokens:
            self.metrics.requests.labels("colocated_short").inc()
            return proxy.direct
        return DisaggPlan(proxy, self)


class DisaggPlan(RoutePlan):
    """Prefill worker -> KV handle -> decode worker; colocated when any step fails."""

    def __init__(self, proxy: Proxy, disagg: PrefillPool) -> None:
        self.proxy = proxy
        self.disagg = disagg
        assert disagg.metrics is not None
        self.metrics = disagg.metrics

    async def execute(self, ctx: RequestContext) -> Answer:
        handle, prefill = await self._prefill(ctx)
        if handle is None:
            return await self._colocated(ctx, prefill)
        response = await self._decode(ctx, handle)
        if response is None:
            if prefill is not None:
                self._drop_handle(prefill, handle)
            return await self._colocated(ctx, "decode_failed")
        self.metrics.requests.labels("disaggregated").inc()
        return response

    async def _colocated(self, ctx: RequestContext, reason: str) -> Answer:
        self.metrics.fallbacks.labels(reason).inc()
        self.metrics.requests.labels("colocated_fallback").inc()
        return await self.proxy.direct.execute(ctx)

    async def _prefill(self, ctx: RequestContext) -> tuple[dict[str, Any] | None, Any]:
        """(the KV handle, the prefill worker) or (None, the reason it failed)."""
        worker = self.disagg.pick_prefill(ctx.route.adapter)
        if worker is None:
            return None, "no_prefill_worker"
        pool = self.disagg.pool
        assert pool is not None
        started = time.perf_counter()
        worker.num_outstanding += 1
        resp = None
        try:
            resp = await self.proxy.client.request(
                worker.url, "POST", WorkerPath.KV_PREFILL + ctx.route.path,
                (self.disagg.keyring.authorization(),), ctx.route.body,
                lines=forwarded_lines(ctx), read_timeout=self.disagg.config.prefill_timeout)
            body = await resp.read()
            if resp.status != 200:
                if resp.status >= 500:
                    pool.record_failure(worker, f"prefill answered {resp.status}",
                                        eject_now=resp.status == 503)
                log.info("request %s: prefill on %s answered %d: %s", ctx.request_id,
                         worker.url, resp.status, body[:300])
                return None, f"prefill_status_{resp.status}"
            handle = json.loads(body)["kv_handle"]
            if not isinstance(handle, dict):
                raise ValueError("kv_handle is not an object")
        except (UpstreamError, ValueError, KeyError, TypeError) as exc:
            pool.record_failure(worker, f"prefill: {type(exc).__name__}")
            log.info("request %s: prefill on %s failed: %r", ctx.request_id, worker.url, exc)
            return None, "prefill_error"
        finally:
            worker.num_outstanding -= 1
            if resp is not None:
                resp.close()
        pool.record_success(worker)
        self.metrics.prefill_latency.observe(time.perf_counter() - started)
        if not handle.get("url"):
            # The address we reached it at reaches it from pods too; the handle's signature
            # covers its URL, so it is signed again with it.
            handle = self.disagg.keyring.sign({**handle, "url": worker.url})
        return handle, worker

    async def _decode(self, ctx: RequestContext,
                      handle: dict[str, Any]) -> Answer | None:
        """The decode worker's answer, relayed; None when the request should run
        colocated: any answer but 200 (409: the KV layout does not fit, 424: the prefill
        peer is gone) or a failure before the first byte."""
        proxy = self.proxy
        worker = proxy.pick(ctx, set())
        if worker is None:
            return None
        handle_header = (InternalHeader.KV_HANDLE, json.dumps(handle, separators=(",", ":")))
        started = time.perf_counter()
        worker.num_outstanding += 1
        try:
            upstream = await proxy.attempt(worker, ctx, extra_headers=[handle_header],
                                           only_200=True)
            self.metrics.handoff_latency.observe(time.perf_counter() - started)
            return await proxy.respond(upstream, worker, ctx)
        except RetryableFailure as exc:
            said = exc.response.body[:300] if exc.response is not None else b""
            log.info("request %s: decode on %s failed before the first byte: %s %s",
                     ctx.request_id, worker.url, exc.reason, said)
            return None
        finally:
            worker.num_outstanding -= 1

    def _drop_handle(self, prefill: Worker, handle: dict[str, Any]) -> None:
        """Free the prefill worker's pinned blocks early (best effort; the TTL is the backstop)."""
        async def drop() -> None:
            assert self.disagg.session is not None
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with self.disagg.session.delete(
                        f"{prefill.url}{WorkerPath.KV_BLOCKS}/{handle['id']}",
                        headers=dict([self.disagg.keyring.authorization()]),
                        timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    await resp.read()

        asyncio.get_running_loop().create_task(drop())
