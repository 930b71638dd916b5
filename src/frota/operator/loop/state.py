"""What the operator keeps between handler calls: one `OperatorState` per process, in kopf's memo.

The children cache is kopf's own indexes (filled from the watches); the rest
is what a reconcile or a timer needs from the ones before it: the status last
written, the writes the cache has not shown yet, each scaler's history, the
KV cache the engines last reported, the fleet keys made sure of, the demand
last seen, and the wake-up flag of each InferenceService's reconcile loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf

from frota.api import InferenceService, InferenceServiceStatus
from frota.api.contract import CHILD_KINDS, ENDPOINT_SLICE, POD, ChildKind
from frota.operator.loop.apply import KubeApi
from frota.operator.loop.children import Applied, Children
from frota.operator.metrics import OperatorMetrics
from frota.operator.scaling import decisions
from frota.operator.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, name) of an InferenceService
ScalerKey = tuple[str, str, str]  # (namespace, name, role); role "" is spec.replicas
Login = Callable[[kopf.OperatorSettings], kopf.ConnectionInfo | None]


def default_login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """kopf's own logins when no Kubernetes client library is installed: the pod's
    service account, else the kubeconfig."""
    return (kopf.login_with_service_account(settings=settings)
            or kopf.login_with_kubeconfig(settings=settings))


def key_of(body: Mapping[str, Any]) -> Key:
    meta = body["metadata"]
    return meta.get("namespace") or "default", meta["name"]


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict copy of a kopf body without managedFields (the cache holds many)."""
    data = dict(body)
    meta = dict(data.get("metadata") or {})
    meta.pop("managedFields", None)
    data["metadata"] = meta
    return data


@dataclass
class OperatorState:
    """One operator process's memory, shared by its handlers through kopf's memo."""

    settings: OperatorSettings = field(default_factory=OperatorSettings)
    login: Login = default_login
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # kopf's index of each watched kind (live views kopf keeps filled from the watches).
    indexes: dict[ChildKind, kopf.Index[Key, dict[str, Any]]] = field(default_factory=dict)
    applied: Applied = field(default_factory=Applied)
    # The status this process last wrote beats the cached body's, which may lag.
    last_status: dict[Key, InferenceServiceStatus] = field(default_factory=dict)
    scalers: dict[ScalerKey, decisions.History] = field(default_factory=dict)  # autoscaler memory
    # KV-cache tokens per replica the serving engines last reported (the capacity timer's);
    # None: no replica serves. Absent until the timer has looked.
    reported_kv: dict[Key, int | None] = field(default_factory=dict)
    # The LoRA adapters each answering serving replica lists (name -> path), read by the same
    # timer; empty: no replica serves. Absent until the timer has looked.
    reported_adapters: dict[Key, tuple[Mapping[str, str | None], ...]] = field(default_factory=dict)
    # The running model-cache fill pod's {"bytes", "totalBytes"} (model_cache_progress).
    cache_progress: dict[Key, dict[str, int | None]] = field(default_factory=dict)
    # The uid whose fleet key this process has made sure of (`frota.operator.loop.fleet_key`).
    fleet_keys: dict[Key, str] = field(default_factory=dict)
    # The demand each fleet's ConfigMap last showed (`frota.operator.scaling.demand`).
    demands: dict[Key, str | None] = field(default_factory=dict)
    # Where the autoscaler reads metrics (tests point these at their own servers).
    metrics_url: Callable[[InferenceService], str | None] = decisions.metrics_url
    role_metrics_urls: Callable[[Iterable[Mapping[str, Any]], str], list[str]] = (
        decisions.role_metrics_urls)
    kube: KubeApi = field(init=False)
    http: aiohttp.ClientSession | None = field(default=None, init=False)  # metrics scrapes
    _wake: dict[Key, asyncio.Event] = field(default_factory=dict, init=False)
    _pending: set[Key] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.kube = KubeApi(self.settings)

    async def open(self) -> None:
        """Open the session every metrics scrape shares (at operator start-up)."""
        self.http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.scrape_timeout_seconds))

    async def close(self) -> None:
        """Close the HTTP sessions (at operator shutdown)."""
        if self.http is not None:
            await self.http.close()
            self.http = None
        await self.kube.close()

    def children(self, key: Key) -> Children:
        """The cached children of one InferenceService."""
        def cached(kind: ChildKind) -> tuple[Mapping[str, Any], ...]:
            index = self.indexes.get(kind)
            return tuple(index[key]) if index is not None and key in index else ()

        slices = cached(ENDPOINT_SLICE) if ENDPOINT_SLICE in self.indexes else None
        objects = tuple(obj for kind in CHILD_KINDS for obj in cached(kind))
        return Children(objects=objects, pods=cached(POD), endpoint_slices=slices)

    # -- waking the reconcile loops --------------------------------------------

    def wakeup(self, key: Key) -> asyncio.Event:
        """The flag a reconcile loop waits on; set, since a loop that starts has work."""
        event = self._wake.setdefault(key, asyncio.Event())
        self.poke(key)
        return event

    def poke(self, key: Key) -> None:
        """This InferenceService may need work: wake its loop (if it runs)."""
        event = self._wake.get(key)
        if event is not None:
            event.set()
            self._pending.add(key)
            self.metrics.pending.set(len(self._pending))

    def idle(self, key: Key) -> None:
        """A reconcile finished and nothing asked for another."""
        if not (event := self._wake.get(key)) or not event.is_set():
            self._pending.discard(key)
            self.metrics.pending.set(len(self._pending))

    def unwatch(self, key: Key, event: asyncio.Event | None = None) -> None:
        """The loop waiting on `event` (any, if None) stopped: deleted, paused or exiting."""
        if event is None or self._wake.get(key) is event:
            self._wake.pop(key, None)
        self.idle(key)

    @property
    def pending(self) -> int:
        """InferenceServices with a reconcile asked for or running."""
        return len(self._pending)

    def report_kv(self, key: Key, tokens: int | None) -> bool:
        """Keep what the engines report (None: no replica serves); True when it is news."""
        news = key not in self.reported_kv or self.reported_kv[key] != tokens
        self.reported_kv[key] = tokens
        return news

    def report_adapters(self, key: Key, lists: tuple[Mapping[str, str | None], ...]) -> bool:
        """Keep the adapters the serving replicas list; True when it is news (the order of
        the replicas is not)."""
        def canonical(found: tuple[Mapping[str, str | None], ...]) -> list[list[tuple[str, str]]]:
            return sorted(sorted((k, v or "") for k, v in one.items()) for one in found)

        news = key not in self.reported_adapters or canonical(self.reported_adapters[key]) != canonical(lists)
        self.reported_adapters[key] = lists
        return news

    def forget(self, key: Key) -> None:
        """Drop the per-object state of a deleted InferenceService."""
        self.last_status.pop(key, None)
        self.reported_kv.pop(key, None)
        self.reported_adapters.pop(key, None)
        self.cache_progress.pop(key, None)
        self.fleet_keys.pop(key, None)
        self.demands.pop(key, None)
        with contextlib.suppress(KeyError):  # never reconciled to a status
            self.metrics.ready.remove(*key)
        for scaler in [k for k in self.scalers if k[:2] == key]:
            del self.scalers[scaler]
        self.unwatch(key)
