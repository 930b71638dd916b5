"""`frota up --scale-to-zero SECONDS`: stop the workers when idle, start them on the next request.

The same contract as on a cluster, with `frota up` as the operator: the router holds the
requests that find no worker (`--hold-seconds`) and POSTs to this module's wake URL
(`--demand-url`), which starts every worker group at once; every second the router's
/metrics are read too, so a lost POST is a second late, not a request lost. Idle is the
cluster's rule: no request for SECONDS (`frota_router_last_request_timestamp_seconds`) and
none in flight, queued or held. Stopped groups are parked in the supervisor, which then
does not restart them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from frota.api.contract import RouterMetric
from frota.api.exposition import sample_totals
from frota.local.supervisor import Supervisor

log = logging.getLogger(__name__)

WAKE_PATH = "/wake"
CHECK_INTERVAL = 1.0


def is_idle(gauges: dict[str, float], idle_seconds: float, now: float) -> bool:
    busy = sum(gauges.get(name, 0.0) for name in (
        RouterMetric.HELD_REQUESTS, RouterMetric.INFLIGHT_REQUESTS, RouterMetric.QUEUE_DEPTH))
    last = gauges.get(RouterMetric.LAST_REQUEST_TIMESTAMP)
    return last is not None and busy == 0 and now - last >= idle_seconds


class IdleScaler:
    """Parks the worker groups after `idle_seconds` without a request; unparks them when
    the router holds one."""

    def __init__(self, supervisor: Supervisor, groups: list[str], router_metrics_url: str,
                 idle_seconds: float, ready_timeout: float,
                 on_change: Callable[[str], None] = lambda message: None) -> None:
        self.supervisor = supervisor
        self.groups = groups
        self.metrics_url = router_metrics_url
        self.idle_seconds = idle_seconds
        self.ready_timeout = ready_timeout
        self.on_change = on_change
        self.wake_url = ""  # set by start()
        self._wake = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def is_parked(self) -> bool:
        return all(g in self.supervisor.parked for g in self.groups)

    async def start(self, port: int = 0) -> str:
        """Serve the wake URL on loopback and return it (what the router's --demand-url is)."""
        async def wake(_: web.Request) -> web.Response:
            self._wake.set()
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post(WAKE_PATH, wake)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.wake_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}{WAKE_PATH}"
        return self.wake_url

    def run(self) -> None:
        """Begin watching (once the fleet is up)."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="idle scaler")

    async def _loop(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), CHECK_INTERVAL)
                woken, gauges = self._wake.is_set(), await self._read(session)
                self._wake.clear()
                if self.is_parked and (woken or gauges.get(RouterMetric.HELD_REQUESTS, 0.0) > 0):
                    await self._unpark()
                elif not self.is_parked and gauges and is_idle(gauges, self.idle_seconds,
                                                               time.time()):
                    await self._park()

    async def _read(self, session: aiohttp.ClientSession) -> dict[str, float]:
        try:
            async with session.get(self.metrics_url) as resp:
                return sample_totals(await resp.text()) if resp.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return {}

    async def _park(self) -> None:
        self.on_change(f"no request for {self.idle_seconds:g} s: stopping the workers "
                       "(the router stays and holds the next request)")
        await asyncio.gather(*(self.supervisor.park(g) for g in self.groups))

    async def _unpark(self) -> None:
        started = time.monotonic()
        self.on_change("a request is held: starting the workers")
        ready = await asyncio.gather(*(self.supervisor.unpark(g, self.ready_timeout)
                                       for g in self.groups))
        took = time.monotonic() - started
        self.on_change(f"workers ready in {took:.1f} s" if all(ready)
                       else f"workers not ready after {took:.0f} s")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._runner is not None:
            await self._runner.cleanup()
