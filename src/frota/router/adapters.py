"""LoRA adapters in the router: which worker holds which, loads on demand, loads fanned out.

**Resident.** A worker's `adapters` (`frota.router.health`): what its `/v1/models` lists
with a `parent` (every adapter loaded there) plus what its `vllm:lora_requests_info`
names running or waiting. The router knows a name as an adapter when some worker holds
it, when it was loaded through the router, or from `--adapters NAME=PATH`.

**Routing.** `requested` reads the body's `model` only once the router knows of any
adapter (a fleet without LoRA pays one attribute test per request). A request for an
adapter goes only to the workers that hold it (`Proxy.pick`); among them the policy
chooses as usual, and the prefix-aware policy keys its affinity by adapter. When no
healthy worker holds it, runtime loading is on (`--lora-runtime-loading`) and the
router knows its path (a load made through it, `--adapters`, or the `root` a worker's
`/v1/models` gave for it), the router first loads it onto the least loaded LoRA
worker; concurrent requests for the same adapter wait on that one load. When it cannot
(runtime loading off, no path, the load failed), the request goes to the policy over
every worker and the client sees the worker's own answer (404 `model_not_found`): the
router does not answer for the workers what only they know.

**Loads through the router.** `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`
(only with runtime loading on, else 404 like vLLM's server; behind the API key) go to
every serving worker of both pools (prefill too, in P/D mode). The answer is 200 with
the first worker's own answer when all succeed; a worker that already had the adapter
(load) or never had it (unload) counts as a success unless every worker says so, and
then its answer is passed on as vLLM would give it. Otherwise the first worker's 4xx
(else 502) in the OpenAI shape, its message naming the workers that failed, listed in
`error.failed_workers`. A load is recorded before it fans out, so a worker being
admitted meanwhile replays it too; a load no worker took is forgotten. An unload
forgets the record and the path first, so nothing loads it back on demand.

**Workers that join later.** Before a LoRA worker enters rotation (re-admission too: it
may have restarted), the router loads the recorded adapters its `/v1/models` lacks
(`replay`; right after instead when its `/metrics` could not be read then). Before, not
after: it never gets a request it would refuse for a missing
load, and only its own start waits (a load reads one adapter file). A failed replay is
logged and counted, and the worker joins anyway: requests for that adapter skip it.
Adapters from `--adapters` are not replayed: the workers load those at start.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from frota.api.contract import WorkerPath
from frota.api.fleet_key import Keyring
from frota.router.errors import error_body, error_response, json_response
from frota.router.health import Worker, WorkerPool
from frota.router.metrics import RouterMetrics
from frota.router.policies import RouteRequest
from frota.router.server import Response

log = logging.getLogger(__name__)


@dataclass
class AdapterConfig:
    """The router's LoRA settings (`--lora-runtime-loading`, `--adapters`, ...)."""

    runtime_loading: bool = False
    paths: dict[str, str] = field(default_factory=dict)  # adapter -> path on the workers
    load_timeout: float = 60.0
    refresh_interval: float = 10.0  # seconds between reads of a worker's /v1/models


def parse_adapter_paths(spec: str | None) -> dict[str, str]:
    """`NAME=PATH,NAME=PATH` (the `--adapters` flag) as a dict."""
    paths: dict[str, str] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, path = item.strip().partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--adapters: {item.strip()!r} is not NAME=PATH")
        paths[name] = path
    return paths


@dataclass
class Outcome:
    """One worker's answer to a load or unload (status 0: it was not reached)."""

    worker: Worker
    status: int
    body: bytes
    content_type: str = "application/json"

    def error(self) -> tuple[str, str, Any]:
        """(message, type, code) of the worker's answer: OpenAI shape, vLLM's older flat
        shape, or plain text."""
        try:
            payload = json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            payload = None
        if isinstance(payload, dict):
            error = payload.get("error")
            error = error if isinstance(error, dict) else payload
            if "message" in error:
                return (str(error["message"]), str(error.get("type") or "upstream_error"),
                        error.get("code"))
        text = self.body.decode("utf-8", "replace").strip()[:500]
        return text or f"answered {self.status}", "upstream_error", None

    def says(self, codes: frozenset[str], words: Sequence[str]) -> bool:
        """A 4xx whose code is one of `codes` or whose message has one of `words`."""
        if not 400 <= self.status < 500:
            return False
        message, _, code = self.error()
        return code in codes or any(w in message.lower() for w in words)

    @property
    def already_loaded(self) -> bool:
        return self.says(frozenset({"adapter_exists"}), ("already",))

    @property
    def not_loaded(self) -> bool:
        return self.status == 404 or self.says(
            frozenset({"adapter_not_found", "model_not_found"}), ("not found", "cannot be found"))


class Adapters:
    """The router's view of LoRA adapters over its pools; one per app."""

    def __init__(self, config: AdapterConfig, metrics: RouterMetrics,
                 keyring: Keyring | None = None) -> None:
        self.config = config
        # Loads and unloads on workers are internal calls: they carry the fleet's credential.
        self.keyring = keyring
        self.runtime_loading = config.runtime_loading
        # Every name the router knows as an adapter (grows; read on every request).
        self.names: set[str] = set(config.paths)
        self.paths: dict[str, str] = dict(config.paths)  # what it may load on demand
        self.recorded: dict[str, str] = {}  # loads made through it, replayed to new workers
        self.pools: list[WorkerPool] = []  # the main pool first
        self.session: aiohttp.ClientSession | None = None
        self._metrics = metrics
        self._loads: dict[str, asyncio.Task[None]] = {}

    def attach(self, pool: WorkerPool) -> None:
        """Track `pool`'s workers; call before its discovery starts."""
        pool.adapter_refresh = self.config.refresh_interval
        pool.on_lora_worker = lambda worker: self.replay(pool, worker)
        pool.on_adapters = self.learn
        self.pools.append(pool)

    def learn(self, worker: Worker) -> None:
        """A worker's adapters changed: know their names, and their paths from the
        workers' `/v1/models` (`root`) unless the router was told one."""
        self.names.update(worker.adapters)
        if worker.lora is not None:
            for name, entry in worker.lora.loaded.items():
                root = entry.get("root")
                if isinstance(root, str) and root and name not in self.paths:
                    self.paths[name] = root

    # -- the request path -------------------------------------------------------

    def requested(self, route: RouteRequest) -> str | None:
        """The adapter the request's `model` names, if the router knows it as one."""
        model = route.json.get("model")
        return model if isinstance(model, str) and model in self.names else None

    def should_load(self, name: str, healthy: Sequence[Worker]) -> bool:
        """True when no healthy worker holds `name` and the router may load it."""
        return (self.runtime_loading and name in self.paths
                and not any(name in w.adapters for w in healthy))

    async def ensure_loaded(self, name: str, pool: WorkerPool) -> None:
        """Load `name` onto the least loaded LoRA worker of `pool`; concurrent callers
        for the same adapter share one load. Never raises: a failure is logged."""
        task = self._loads.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load_on_demand(name, pool))
            self._loads[name] = task
            task.add_done_callback(lambda t: self._loads.pop(name, None)
                                   if self._loads.get(name) is t else None)
        # Shielded: a client that leaves does not cancel the load the others wait for.
        await asyncio.shield(task)

    async def _load_on_demand(self, name: str, pool: WorkerPool) -> None:
        healthy = pool.healthy()
        if any(name in w.adapters for w in healthy):
            return  # loaded meanwhile (a fan-out, a scrape)
        candidates = [w for w in healthy if w.lora is not None]
        path = self.paths.get(name)
        if not candidates or path is None:
            return
        worker = min(candidates, key=lambda w: (w.num_outstanding, len(w.adapters)))
        outcome = await self._load_one(pool, worker, name, path, "demand")
        if outcome.status != 200 and not outcome.already_loaded:
            log.warning("loading adapter %s onto %s failed: %d %s", name, worker.url,
                        outcome.status, outcome.error()[0])

    # -- workers that join ------------------------------------------------------

    async def replay(self, pool: WorkerPool, worker: Worker) -> None:
        """Load the recorded adapters `worker` lacks (each tried once; loads recorded
        while this runs are picked up before it returns)."""
        tried: set[str] = set()
        while True:
            loaded = worker.lora.loaded if worker.lora is not None else {}
            missing = [(n, p) for n, p in self.recorded.items()
                       if n not in tried and n not in loaded]
            if not missing:
                return
            for name, path in missing:
                tried.add(name)
                outcome = await self._load_one(pool, worker, name, path, "replay")
                if outcome.status != 200 and not outcome.already_loaded:
                    log.warning("replaying adapter %s to %s failed: %d %s", name, worker.url,
                                outcome.status, outcome.error()[0])
                else:
                    log.info("adapter %s replayed to %s", name, worker.url)

    # -- one worker -------------------------------------------------------------

    async def _call(self, worker: Worker, path: str, payload: dict[str, str]) -> Outcome:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.config.load_timeout)
        try:
            headers = dict([self.keyring.authorization()]) if self.keyring else None
            async with self.session.post(worker.url + path, json=payload, headers=headers,
                                         timeout=timeout) as resp:
                return Outcome(worker, resp.status, await resp.read(),
                               resp.headers.get("Content-Type", "text/plain"))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return Outcome(worker, 0, f"unreachable: {type(exc).__name__}".encode())

    async def _load_one(self, pool: WorkerPool, worker: Worker, name: str, path: str,
                        trigger: str) -> Outcome:
        outcome = await self._call(worker, WorkerPath.LOAD_LORA_ADAPTER,
                                   {"lora_name": name, "lora_path": path})
        ok = outcome.status == 200 or outcome.already_loaded
        self._metrics.adapter_loads.labels(trigger, _result(outcome.status, ok)).inc()
        if ok:
            # The worker's own entry (its `parent`, `root`) for /v1/models; until the
            # list is read, one built from what was asked.
            await pool.read_models(worker, aiohttp.ClientTimeout(total=pool.probe_timeout))
            lora = worker.lora
            entry = (lora.loaded.get(name) if lora is not None else None) or {
                "id": name, "object": "model", "owned_by": "frota", "root": path}
            pool.set_loaded(worker, name, entry)
        return outcome

    # -- the endpoints ----------------------------------------------------------

    def _serving(self) -> list[tuple[WorkerPool, Worker]]:
        return [(pool, w) for pool in self.pools for w in pool.healthy()]

    async def load(self, body: dict[str, Any]) -> Response:
        """`POST /v1/load_lora_adapter` through the router (see the module docstring)."""
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            return error_response(400, "lora_name and lora_path are required",
                                  "invalid_request_error", "invalid_request")
        targets = self._serving()
        if not targets:
            return _no_workers()
        previous = self.recorded.get(name)
        self.recorded[name] = path  # first: a worker admitted meanwhile replays it
        outcomes = await asyncio.gather(
            *(self._load_one(pool, w, name, path, "api") for pool, w in targets))
        fresh = [o for o in outcomes if o.status == 200]
        if fresh:
            self.names.add(name)
            self.paths[name] = path
        else:  # nobody took it: what the router remembered stays as it was
            if previous is None:
                self.recorded.pop(name, None)
            else:
                self.recorded[name] = previous
        failed = [o for o in outcomes if o.status != 200 and not o.already_loaded]
        return _answer(outcomes, fresh, failed)

    async def unload(self, body: dict[str, Any]) -> Response:
        """`POST /v1/unload_lora_adapter` through the router."""
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            return error_response(400, "lora_name is required", "invalid_request_error",
                                  "invalid_request")
        targets = self._serving()
        if not targets:
            return _no_workers()
        self.recorded.pop(name, None)  # first: nothing replays or loads it back meanwhile
        self.paths.pop(name, None)
        outcomes = await asyncio.gather(*(self._unload_one(pool, w, name) for pool, w in targets))
        fresh = [o for o in outcomes if o.status == 200]
        failed = [o for o in outcomes if o.status != 200 and not o.not_loaded]
        return _answer(outcomes, fresh, failed)

    async def _unload_one(self, pool: WorkerPool, worker: Worker, name: str) -> Outcome:
        outcome = await self._call(worker, WorkerPath.UNLOAD_LORA_ADAPTER, {"lora_name": name})
        ok = outcome.status == 200 or outcome.not_loaded
        self._metrics.adapter_unloads.labels(_result(outcome.status, ok)).inc()
        if ok:
            pool.set_loaded(worker, name, None)
        return outcome

    # -- /v1/models --------------------------------------------------------------

    def merge_models(self, payload: Any) -> bool:
        """Add to a worker's `/v1/models` answer the adapters other serving workers hold
        (each once); True when something was added."""
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            return False
        seen = {m.get("id") for m in data if isinstance(m, dict)}
        added = False
        for _, worker in self._serving():
            if worker.lora is None:
                continue
            for name, entry in worker.lora.loaded.items():
                if name not in seen:
                    seen.add(name)
                    data.append(entry)
                    added = True
        return added


def _result(status: int, ok: bool) -> str:
    """The `result` label: ok, noop (it was loaded already / was not loaded), error."""
    return "ok" if status == 200 else "noop" if ok else "error"


def _no_workers() -> Response:
    return error_response(503, "no healthy worker to load the adapter onto; retry once the "
                          "fleet serves", "service_unavailable", "no_healthy_workers",
                          headers={"Retry-After": "1"})


def _answer(outcomes: Sequence[Outcome], fresh: Sequence[Outcome],
            failed: Sequence[Outcome]) -> Response:
    """200 with the first success when nothing failed and something changed; every
    worker saying "already"/"not there": the first one's answer; else the first 4xx."""
    if not failed:
        first = fresh[0] if fresh else outcomes[0]
        return Response(first.status, first.body, [("Content-Type", first.content_type)])
    chosen = next((o for o in failed if 400 <= o.status < 500), None)
    for o in failed:  # the workers' addresses and words are for the log, not the client
        log.warning("adapter call failed on %s: %d %s", o.worker.url, o.status, o.error()[0])
    if chosen is None:
        return json_response(error_body(
            f"no worker could complete the call (failed on {len(failed)} of {len(outcomes)} "
            "workers); retry", "upstream_error", "upstream_error"), status=502)
    message, type_, code = chosen.error()
    body = error_body(f"{message} (failed on {len(failed)} of {len(outcomes)} workers)",
                      type_, code)
    return json_response(body, status=chosen.status)
