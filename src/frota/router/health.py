"""Which workers are fit to serve: active `/ready` probes, passive ejection, re-admission.

A worker enters the pool (from discovery) out of rotation and is probed at once;
it joins when `/ready` answers 200. Failures seen by the proxy before a
response's first byte (connection refused, 503, the worker vanishing) and failed
probes share one counter: after `eject_after` consecutive failures the worker
leaves rotation. An explicit 503 from `/ready` (loading, draining) takes it out
at once. The probe keeps running on ejected workers and re-admits them on the
first 200. When a policy needs the workers' own load, the same loop scrapes
`/metrics` for the vLLM gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp

from frota.api.contract import WorkerMetric
from frota.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

SCRAPED_GAUGES = {
    WorkerMetric.NUM_REQUESTS_WAITING: "num_waiting",
    WorkerMetric.NUM_REQUESTS_RUNNING: "num_running",
    WorkerMetric.KV_CACHE_USAGE_PERC: "kv_usage",
}
_SCRAPED_NAMES = tuple(SCRAPED_GAUGES)


@dataclass
class WorkerLoad:
    """The load a worker reports about itself on `/metrics` (vLLM gauge names)."""

    num_waiting: float = 0.0
    num_running: float = 0.0
    kv_usage: float = 0.0
    scraped_at: float = 0.0


@dataclass(eq=False)
class Worker:
    """One replica as the router sees it: its URL, health and the load on it."""

    url: str
    is_healthy: bool = False
    was_ever_healthy: bool = False
    num_consecutive_failures: int = 0
    num_outstanding: int = 0
    # Why the worker is out of rotation, as last logged (each new reason is logged once).
    last_failure: str = ""
    load: WorkerLoad = field(default_factory=WorkerLoad)


def parse_vllm_load(text: str) -> WorkerLoad:
    """Sum the vLLM load gauges in a Prometheus text exposition (labels ignored)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_SCRAPED_NAMES):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        attr = SCRAPED_GAUGES.get(line[:name_end])
        if attr is None:
            continue
        rest = line[line.rfind("}") + 1:] if line[name_end] == "{" else line[name_end:]
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        values[attr] = values.get(attr, 0.0) + value
    return WorkerLoad(**values, scraped_at=time.monotonic())


class WorkerPool:
    """The set of known workers and their health; discovery feeds it, policies read it."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        metrics: RouterMetrics,
        *,
        probe_interval: float = 1.0,
        probe_timeout: float = 2.0,
        eject_after: int = 3,
        scrape_metrics: bool = False,
    ) -> None:
        self._session = session
        self._metrics = metrics
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.eject_after = eject_after
        self.scrape_metrics = scrape_metrics
        self.workers: dict[str, Worker] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._healthy: list[Worker] = []
        self._changed = asyncio.Event()

    # -- membership (discovery) ------------------------------------------------

    def set_urls(self, urls: Iterable[str]) -> None:
        """Make the pool's membership `urls`; new workers are probed before they serve."""
        wanted = {u.rstrip("/") for u in urls}
        for url in list(self.workers):
            if url not in wanted:
                self._remove(url)
        for url in sorted(wanted - self.workers.keys()):
            worker = Worker(url)
            self.workers[url] = worker
            self._metrics.worker_healthy.labels(url).set(0)
            self._probes[url] = asyncio.get_running_loop().create_task(
                self._probe_loop(worker), name=f"probe {url}")
            log.info("worker added: %s", url)
        self._refresh()

    def _remove(self, url: str) -> None:
        self.workers.pop(url, None)
        task = self._probes.pop(url, None)
        if task is not None:
            task.cancel()
        for metric in (self._metrics.worker_healthy, self._metrics.worker_outstanding):
            with contextlib.suppress(KeyError):
                metric.remove(url)
        log.info("worker removed: %s", url)

    async def close(self) -> None:
        tasks = list(self._probes.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._probes.clear()

    # -- what policies see -----------------------------------------------------

    def healthy(self) -> list[Worker]:
        """Workers in rotation, in a stable order (by URL)."""
        return self._healthy

    async def wait_healthy(self, timeout: float) -> bool:
        """Wait until at least one worker is in rotation (True) or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not self._healthy:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    def _refresh(self) -> None:
        self._healthy = sorted((w for w in self.workers.values() if w.is_healthy),
                               key=lambda w: w.url)
        self._changed.set()

    # -- outcomes --------------------------------------------------------------

    def record_success(self, worker: Worker) -> None:
        worker.num_consecutive_failures = 0
        worker.last_failure = ""
        if not worker.is_healthy and worker.url in self.workers:
            self._admit(worker)

    def record_failure(self, worker: Worker, reason: str, *, eject_now: bool = False) -> None:
        worker.num_consecutive_failures += 1
        if worker.is_healthy and (eject_now or worker.num_consecutive_failures >= self.eject_after):
            worker.is_healthy = False
            self._metrics.ejections.labels(worker.url).inc()
            self._metrics.worker_healthy.labels(worker.url).set(0)
            log.warning("worker ejected: %s (%s, %d consecutive failures)",
                        worker.url, reason, worker.num_consecutive_failures)
            self._refresh()
        elif not worker.is_healthy and reason != worker.last_failure:
            # A worker that never answers would otherwise be silent: say why it is
            # kept out (refused, timed out, 503 while loading) each time the why changes.
            log.info("worker not in rotation: %s (%s)", worker.url, reason)
        worker.last_failure = reason

    def _admit(self, worker: Worker) -> None:
        worker.is_healthy = True
        if worker.was_ever_healthy:
            self._metrics.readmissions.labels(worker.url).inc()
            log.info("worker re-admitted: %s", worker.url)
        else:
            log.info("worker ready: %s", worker.url)
        worker.was_ever_healthy = True
        self._metrics.worker_healthy.labels(worker.url).set(1)
        self._refresh()

    # -- the active probe ------------------------------------------------------

    async def _probe_loop(self, worker: Worker) -> None:
        while True:
            await self.probe(worker)
            # Poll a worker that has never been ready faster, so start-up is prompt.
            interval = self.probe_interval if worker.was_ever_healthy else min(
                self.probe_interval, 0.2)
            await asyncio.sleep(interval)

    async def probe(self, worker: Worker) -> bool:
        """Probe `/ready` once (and scrape `/metrics` when asked); update health."""
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout)
        try:
            async with self._session.get(worker.url + "/ready", timeout=timeout) as resp:
                await resp.read()
                ok, status = resp.status == 200, resp.status
            if status == 404:
                # A server without /ready (vLLM's): it listens only once its model is loaded,
                # so its /health is its readiness.
                async with self._session.get(worker.url + "/health", timeout=timeout) as resp:
                    await resp.read()
                    ok, status = resp.status == 200, resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, status = False, 0
            reason = f"probe: {type(exc).__name__}"
        if ok:
            self.record_success(worker)
            if self.scrape_metrics:
                await self._scrape(worker, timeout)
            return True
        if status:
            reason = f"probe: {resp.url.path} answered {status}"
        # The worker said it is not ready (loading, draining): believe it at once.
        self.record_failure(worker, reason, eject_now=status == 503)
        return False

    async def _scrape(self, worker: Worker, timeout: aiohttp.ClientTimeout) -> None:
        try:
            async with self._session.get(worker.url + "/metrics", timeout=timeout) as resp:
                if resp.status == 200:
                    worker.load = parse_vllm_load(await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass  # stale load numbers are still better than none; health is /ready's job
