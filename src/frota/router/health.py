"""Which workers are fit to serve: active `/ready` probes, passive ejection, re-admission.

A worker enters the pool (from discovery) out of rotation and is probed at once;
it joins when `/ready` answers 200. Failures seen by the proxy before a
response's first byte (connection refused, 503, the worker vanishing) and failed
probes share one counter: after `eject_after` consecutive failures the worker
leaves rotation. An explicit 503 from `/ready` (loading, draining) takes it out
at once. The probe keeps running on ejected workers and re-admits them on the
first 200. When a policy needs the workers' own load, the same loop scrapes
`/metrics` for the vLLM gauges.

LoRA adapters: before a worker joins (and re-joins: it may have restarted) rotation,
what the router knew of its adapters is dropped and its `/metrics` read; a worker that
exports `vllm:lora_requests_info` (the family is there: vLLM's and Frota's workers
export it only with LoRA on) is scraped at every probe from then on, and its
`/v1/models` is read when it is first seen so, whenever the metric names an adapter
the last list lacked or its `max_lora` changes, and every `adapter_refresh` seconds
otherwise (to see loads and unloads made on the worker directly). A worker's
`adapters`, what routing reads, are the union of the two: vLLM's metric names only the
adapters with requests running or waiting, `/v1/models` every loaded one. A fleet
without LoRA pays one `/metrics` read per admission and nothing per probe (a read that
fails is retried at each probe until one answers). `on_lora_worker` runs when a worker
is first seen with LoRA, so before it is admitted unless that first read failed (the
router replays its recorded adapter loads there, `frota.router.adapters`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from frota.api.adapters import model_list_adapters
from frota.api.contract import ServingPath, WorkerMetric
from frota.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

SCRAPED_GAUGES = {
    WorkerMetric.NUM_REQUESTS_WAITING: "num_waiting",
    WorkerMetric.NUM_REQUESTS_RUNNING: "num_running",
    WorkerMetric.KV_CACHE_USAGE_PERC: "kv_usage",
}
_SCRAPED_NAMES = tuple(SCRAPED_GAUGES)
LORA_INFO = WorkerMetric.LORA_REQUESTS_INFO  # the adapters with requests in flight, and slots
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class LoraInfo:
    """A worker's `vllm:lora_requests_info`: adapters running or waiting, and its slots."""

    active: frozenset[str] = frozenset()
    max_lora: int = 0


@dataclass
class WorkerLoad:
    """The load a worker reports about itself on `/metrics` (vLLM gauge names)."""

    num_waiting: float = 0.0
    num_running: float = 0.0
    kv_usage: float = 0.0
    scraped_at: float = 0.0
    lora: LoraInfo | None = None  # None: the worker does not export the LoRA gauge


@dataclass
class WorkerLora:
    """What a LoRA worker holds: `loaded` is its `/v1/models` adapters (name -> entry)."""

    max_lora: int = 0
    active: frozenset[str] = frozenset()
    loaded: dict[str, dict[str, Any]] = field(default_factory=dict)
    models_read_at: float = 0.0  # monotonic; 0: read the list at the next scrape


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
    # The adapters a request may be routed here for (loaded or active); routing reads it.
    adapters: frozenset[str] = frozenset()
    lora: WorkerLora | None = None  # None: no LoRA on this worker (or not known yet)
    metrics_read: bool = False  # a /metrics read got an answer (so `lora` is known)


def parse_lora_info(text: str) -> LoraInfo | None:
    """The `vllm:lora_requests_info` of an exposition: None when the family is absent.

    vLLM keeps one sample per label set it ever reported, each valued with the time it
    was set: the newest (largest value) is the current one. A family with no sample
    yet (vLLM before its first request) is LoRA on, nothing active.
    """
    if LORA_INFO not in text:
        return None
    best: tuple[float, str] | None = None
    prefix = LORA_INFO + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        end = line.rfind("}")
        try:
            value = float(line[end + 1:].split()[0])
        except (ValueError, IndexError):
            continue
        if best is None or value >= best[0]:
            best = (value, line[len(prefix):end])
    if best is None:
        return LoraInfo()
    labels = dict(_LABEL.findall(best[1]))
    active = {name for key in ("running_lora_adapters", "waiting_lora_adapters")
              for name in labels.get(key, "").split(",") if name}
    try:
        max_lora = int(float(labels.get("max_lora", "0")))
    except ValueError:
        max_lora = 0
    return LoraInfo(frozenset(active), max_lora)


def parse_vllm_load(text: str) -> WorkerLoad:
    """Sum the vLLM load gauges in a Prometheus text exposition (labels ignored), and
    read its LoRA gauge (`parse_lora_info`)."""
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
    return WorkerLoad(**values, scraped_at=time.monotonic(), lora=parse_lora_info(text))


WorkerHook = Callable[["Worker"], Awaitable[None]]


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
        adapter_refresh: float = 10.0,
        on_lora_worker: WorkerHook | None = None,
        on_adapters: Callable[[Worker], None] | None = None,
    ) -> None:
        self._session = session
        self._metrics = metrics
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.eject_after = eject_after
        self.scrape_metrics = scrape_metrics
        self.adapter_refresh = adapter_refresh
        # When a worker is first seen with LoRA (the router replays its adapter loads there).
        self.on_lora_worker = on_lora_worker
        # After a worker's `adapters` changed (the router learns names and paths).
        self.on_adapters = on_adapters
        self.workers: dict[str, Worker] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._healthy: list[Worker] = []
        self._changed = asyncio.Event()
        metrics.worker_outstanding.add_reader(self._outstanding)

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
        with contextlib.suppress(KeyError):
            self._metrics.worker_healthy.remove(url)
        log.info("worker removed: %s", url)

    async def close(self) -> None:
        tasks = list(self._probes.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._probes.clear()

    def _outstanding(self) -> list[tuple[tuple[str], float]]:
        """Each worker's requests in flight, as its metric's series."""
        return [((url,), worker.num_outstanding) for url, worker in self.workers.items()]

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
            async with self._session.get(worker.url + ServingPath.READY, timeout=timeout) as resp:
                await resp.read()
                ok, status = resp.status == 200, resp.status
            if status == 404:
                # A server without /ready (vLLM's): it listens only once its model is loaded,
                # so its /health is its readiness.
                async with self._session.get(worker.url + ServingPath.HEALTH,
                                             timeout=timeout) as resp:
                    await resp.read()
                    ok, status = resp.status == 200, resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, status = False, 0
            reason = f"probe: {type(exc).__name__}"
        if ok:
            if not worker.is_healthy:
                await self._before_admission(worker, timeout)
            elif self.scrape_metrics or worker.lora is not None or not worker.metrics_read:
                await self._scrape(worker, timeout)
            self.record_success(worker)
            return True
        if status:
            reason = f"probe: {resp.url.path} answered {status}"
        # The worker said it is not ready (loading, draining): believe it at once.
        self.record_failure(worker, reason, eject_now=status == 503)
        return False

    async def _before_admission(self, worker: Worker, timeout: aiohttp.ClientTimeout) -> None:
        """Learn afresh whether the worker has LoRA and what it holds (it may have
        restarted since it was last in rotation)."""
        worker.lora = None
        worker.metrics_read = False
        self._set_adapters(worker, frozenset())
        await self._scrape(worker, timeout)

    async def _scrape(self, worker: Worker, timeout: aiohttp.ClientTimeout) -> None:
        try:
            async with self._session.get(worker.url + ServingPath.METRICS, timeout=timeout) as resp:
                worker.metrics_read = True  # a worker without /metrics has no LoRA gauge
                if resp.status != 200:
                    return
                load = parse_vllm_load(await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return  # stale load numbers are still better than none; health is /ready's job
        worker.load = load
        await self._track_lora(worker, load.lora, timeout)

    async def _track_lora(self, worker: Worker, info: LoraInfo | None,
                          timeout: aiohttp.ClientTimeout) -> None:
        """Update the worker's adapters from its LoRA gauge, reading `/v1/models` when
        the gauge shows something the last list lacked, or the list is due."""
        lora = worker.lora
        if info is None:  # no LoRA (or restarted without)
            worker.lora = None
            self._set_adapters(worker, frozenset())
            return
        first_seen = lora is None
        if lora is None:
            lora = worker.lora = WorkerLora()
        stale = (not lora.models_read_at or info.max_lora != lora.max_lora
                 or not info.active <= lora.loaded.keys()
                 or time.monotonic() - lora.models_read_at >= self.adapter_refresh)
        lora.max_lora, lora.active = info.max_lora, info.active
        if stale:
            await self.read_models(worker, timeout)
        # A fresh list is news even when the names stand (the router learns paths there).
        self._set_adapters(worker, frozenset(lora.loaded) | lora.active, notify=stale)
        if first_seen and self.on_lora_worker is not None:
            try:
                await self.on_lora_worker(worker)
            except Exception:  # a failed replay must not keep a serving worker out
                log.exception("adapter replay to %s failed", worker.url)

    async def read_models(self, worker: Worker, timeout: aiohttp.ClientTimeout) -> None:
        """Read the worker's `/v1/models` into `worker.lora.loaded` (kept on failure)."""
        lora = worker.lora
        if lora is None:
            return
        try:
            async with self._session.get(worker.url + ServingPath.MODELS, timeout=timeout) as resp:
                if resp.status != 200:
                    return
                payload = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return
        lora.loaded = model_list_adapters(payload) or {}
        lora.models_read_at = time.monotonic()

    def set_loaded(self, worker: Worker, name: str, entry: dict[str, Any] | None) -> None:
        """Record a load (`entry`) or an unload (None) the router made on `worker`."""
        lora = worker.lora
        if lora is None:
            lora = worker.lora = WorkerLora()
        if entry is None:  # new requests for it are refused at once, even while some run
            lora.loaded.pop(name, None)
            lora.active = lora.active - {name}
        else:
            lora.loaded[name] = entry
        self._set_adapters(worker, frozenset(lora.loaded) | lora.active)

    def _set_adapters(self, worker: Worker, adapters: frozenset[str],
                      notify: bool = False) -> None:
        if adapters != worker.adapters or notify:
            worker.adapters = adapters
            if self.on_adapters is not None:
                self.on_adapters(worker)
