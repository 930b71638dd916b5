"""Holding requests while no worker is ready: what scale to zero needs from the router.

A fleet scaled to zero keeps its router. A request that finds no worker in rotation waits
here, up to `--hold-seconds`, instead of getting the 503 it would otherwise get at once:
- held requests are released in arrival order when a worker comes into rotation (they wait
  on one event, whose waiters wake first come first served), and then routed as any other,
  streams and retries before the first byte included;
- past the hold time, or beyond `--max-held-requests` at once, the answer is a 503 in
  OpenAI's shape with Retry-After;
- a client that disconnects leaves the queue (its handler is cancelled mid-wait).

The first held request announces the demand, so that the fleet comes back without waiting
for the operator's next look at the router's metrics: on a cluster the router stamps the
fleet's demand ConfigMap (`contract.Demand`, a merge patch its Role allows on that one
object and no other write; never its InferenceService), with `frota up` it calls the
supervisor's URL. While requests stay held it
announces again at most every `ANNOUNCE_INTERVAL` seconds (a missed patch is retried);
`frota_router_held_requests` says how many wait, for the operator's own tick as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp

from frota.api.contract import Demand
from frota.router.discovery import KubeApi
from frota.router.errors import error_response
from frota.router.health import WorkerPool
from frota.router.metrics import RouterMetrics
from frota.router.server import Response

log = logging.getLogger(__name__)

ANNOUNCE_INTERVAL = 2.0  # seconds between announcements while requests stay held
ANNOUNCE_TIMEOUT = aiohttp.ClientTimeout(total=5)

Announce = Callable[[aiohttp.ClientSession], Awaitable[None]]


@dataclass(frozen=True)
class HoldConfig:
    """`--hold-seconds` (0: no holding, 503 at once), `--max-held-requests`, and the
    Retry-After of the 503s."""

    seconds: float = 0.0
    max_held: int = 1024
    retry_after: int = 5


def kubernetes_announcer(api: KubeApi, namespace: str, name: str) -> Announce:
    """Stamp the demand ConfigMap `namespace/name` with the time now (a merge patch of its
    one key; the operator made the ConfigMap, and answers a new stamp)."""
    url = f"{api.server}/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}"

    async def announce(session: aiohttp.ClientSession) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = json.dumps({"data": {Demand.DATA_KEY: now}})
        headers = {**api.headers(), "Content-Type": "application/merge-patch+json"}
        async with session.patch(url, data=body, headers=headers, ssl=api.ssl_context,
                                 timeout=ANNOUNCE_TIMEOUT) as resp:
            if resp.status != 200:
                raise RuntimeError(f"PATCH {namespace}/{name}: {resp.status} "
                                   f"{(await resp.text())[:200]}")

    return announce


def url_announcer(url: str) -> Announce:
    """POST to `url` (`frota up`'s supervisor starts its workers)."""
    async def announce(session: aiohttp.ClientSession) -> None:
        async with session.post(url, timeout=ANNOUNCE_TIMEOUT) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"POST {url}: {resp.status}")

    return announce


class Hold:
    """The bounded waiting room in front of an empty pool."""

    def __init__(self, config: HoldConfig, metrics: RouterMetrics,
                 announce: Announce | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.announce = announce
        self.session: aiohttp.ClientSession | None = None  # set by the router at start
        self.num_held = 0
        self._last_announced = -float("inf")
        self._announcing: asyncio.Task[None] | None = None

    async def until_serving(self, pool: WorkerPool) -> Response | None:
        """None once `pool` has a worker in rotation (at once when it has one); else the
        503 to answer: holding is off, the room is full, or the hold time ran out."""
        if pool.healthy() or self.config.seconds <= 0:
            return None
        if self.num_held >= self.config.max_held:
            return self._refusal(f"{self.num_held} requests are already held while no worker "
                                 "is ready", "hold_full")
        self.num_held += 1
        self.metrics.held.inc()
        try:
            self._maybe_announce()
            if await pool.wait_healthy(self.config.seconds):
                return None
        finally:
            self.num_held -= 1
            self.metrics.held.dec()
        return self._refusal(f"no worker became ready within {self.config.seconds:g}s "
                             "(the fleet may be starting from zero)", "hold_timeout")

    def _refusal(self, message: str, code: str) -> Response:
        return error_response(503, f"{message}; retry after {self.config.retry_after}s",
                              "service_unavailable", code,
                              headers={"Retry-After": str(self.config.retry_after)})

    def _maybe_announce(self) -> None:
        """Announce the demand in the background, at most every ANNOUNCE_INTERVAL seconds."""
        if self.announce is None or self.session is None:
            return
        now = time.monotonic()
        if now - self._last_announced < ANNOUNCE_INTERVAL:
            return
        if self._announcing is not None and not self._announcing.done():
            return
        self._last_announced = now
        self._announcing = asyncio.get_running_loop().create_task(self._announce(),
                                                                  name="announce demand")

    async def _announce(self) -> None:
        assert self.announce is not None and self.session is not None
        try:
            await self.announce(self.session)
            log.info("no worker is ready: announced the demand (%d held)", self.num_held)
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:
            log.warning("could not announce the demand: %s; retrying while requests are held",
                        exc)
            self._last_announced = -float("inf")

    async def close(self) -> None:
        if self._announcing is not None:
            self._announcing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._announcing
