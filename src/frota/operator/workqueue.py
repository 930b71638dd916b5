"""Operator-wide state: the children cache, one lock per InferenceService, a coalescing queue.

Watches on children only say "this InferenceService may need work"; the
queue runs at most one reconcile per InferenceService at a time and folds
any number of pokes that arrive meanwhile into one more run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from frota.api import InferenceServiceStatus
from frota.api.contract import (
    CHILD_KINDS,
    ENDPOINT_SLICE,
    INFERENCE_SERVICE,
    POD,
    ChildKind,
    EventReason,
)
from frota.operator import autoscale
from frota.operator.metrics import OperatorMetrics
from frota.operator.reconcile import Applied, Children, Outcome, reconcile

Key = tuple[str, str]  # (namespace, name)


def index_id(kind: ChildKind) -> str:
    """The id of kopf's in-memory index of one kind (kopf passes indexes as kwargs by id)."""
    return f"frota_{kind.plural}"


CHILD_INDEXES = tuple(index_id(k) for k in CHILD_KINDS)
POD_INDEX = index_id(POD)
ENDPOINT_INDEX = index_id(ENDPOINT_SLICE)
ISVC_INDEX = index_id(INFERENCE_SERVICE)

log = logging.getLogger("frota.operator")


@dataclass
class Fleet:
    """What the operator keeps between handler calls (one per process)."""

    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    indexes: dict[str, Any] = field(default_factory=dict)
    retry_delay: float = 5.0
    recheck_delay: float = 2.0
    metrics_url: Callable[[Mapping[str, Any]], str | None] = autoscale.metrics_url
    role_metrics_urls: Callable[
        [Mapping[str, Any], Iterable[Mapping[str, Any]], str], list[str]
    ] = autoscale.role_metrics_urls
    autoscale_history: dict[Key, autoscale.History] = field(default_factory=dict)
    applied: Applied = field(default_factory=Applied)
    _locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    _dirty: set[Key] = field(default_factory=set)
    _tasks: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    _last_status: dict[Key, InferenceServiceStatus] = field(default_factory=dict)

    def children(self, key: Key) -> Children:
        """The cached children of one InferenceService."""
        objects: list[Mapping[str, Any]] = []
        for name in CHILD_INDEXES:
            index = self.indexes.get(name)
            if index is not None and key in index:
                objects.extend(index[key])
        pods_index = self.indexes.get(POD_INDEX)
        pods = tuple(pods_index[key]) if pods_index is not None and key in pods_index else ()
        slices_index = self.indexes.get(ENDPOINT_INDEX)
        slices: tuple[Mapping[str, Any], ...] | None = None
        if slices_index is not None:
            slices = tuple(slices_index[key]) if key in slices_index else ()
        return Children(objects=tuple(objects), pods=pods, endpoint_slices=slices)

    def body(self, key: Key) -> Mapping[str, Any] | None:
        """The cached InferenceService, or None once it is gone."""
        index = self.indexes.get(ISVC_INDEX)
        if index is None or key not in index:
            return None
        return next(iter(index[key]), None)

    def lock(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def forget(self, key: Key) -> None:
        """Drop the per-object state of a deleted InferenceService."""
        self._locks.pop(key, None)
        self._last_status.pop(key, None)
        self.autoscale_history.pop(key, None)
        self._dirty.discard(key)

    async def reconcile(self, body: Mapping[str, Any], *, logger: Any) -> Outcome:
        """Reconcile one InferenceService now, under its lock; count the result."""
        meta = body["metadata"]
        key = (meta.get("namespace") or "default", meta["name"])
        async with self.lock(key):
            started = time.perf_counter()
            # The status this process last wrote beats the cached body's, which
            # may not have caught up yet (so each transition is posted once).
            old = self._last_status.get(key)
            try:
                outcome = await reconcile(body, self.children(key), logger=logger, old_status=old,
                                          applied=self.applied)
            except kopf.TemporaryError:
                self.metrics.reconciles.labels("retry").inc()
                raise
            except kopf.PermanentError as exc:
                # Retrying cannot help: say so where users look, then stop retrying.
                self.metrics.reconciles.labels("error").inc()
                kopf.event(dict(body), type="Warning", reason=EventReason.RECONCILE_FAILED,
                           message=f"{exc}; not retrying until the spec or cluster changes")
                raise
            except Exception:
                self.metrics.reconciles.labels("error").inc()
                raise
            finally:
                self.metrics.duration.observe(time.perf_counter() - started)
            if outcome.status is not None:
                self._last_status[key] = outcome.status
            if outcome.recheck:
                asyncio.get_running_loop().call_later(self.recheck_delay, self.kick, *key)
            self.metrics.reconciles.labels(outcome.result).inc()
            for ref in outcome.applied:
                self.metrics.applied.labels(ref.split("/", 1)[0]).inc()
            return outcome

    def kick(self, namespace: str | None, name: str | None) -> None:
        """Ask for a reconcile of one InferenceService soon (coalesced)."""
        if not name:
            return
        key = (namespace or "default", name)
        task = self._tasks.get(key)
        if task is not None and not task.done():
            self._dirty.add(key)
            return
        self._dirty.add(key)
        self._tasks[key] = asyncio.create_task(self._drain(key), name=f"reconcile {key}")
        self.metrics.pending.set(sum(1 for t in self._tasks.values() if not t.done()))

    async def _drain(self, key: Key) -> None:
        try:
            while key in self._dirty:
                self._dirty.discard(key)
                body = self.body(key)
                if body is None:
                    self.forget(key)
                    return
                try:
                    await self.reconcile(body, logger=log)
                except kopf.TemporaryError as exc:
                    log.warning("reconcile of %s/%s will retry in %ss: %s", *key, exc.delay, exc)
                    await asyncio.sleep(exc.delay or self.retry_delay)
                    self._dirty.add(key)
                except Exception:
                    log.exception("reconcile of %s/%s failed; waiting for the next change", *key)
        finally:
            self._tasks.pop(key, None)
            self.metrics.pending.set(sum(1 for t in self._tasks.values() if not t.done()))

    async def stop(self) -> None:
        """Cancel queued reconciles (operator shutdown)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

