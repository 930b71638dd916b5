"""Each InferenceService's reconcile loop, run by kopf as a daemon.

Why a loop, and why it coalesces: the spec's handlers and the watches on
every child kind only say "this InferenceService may need work", and during a
rollout pod events arrive many times a second. Each says so by setting one
flag (`OperatorState.poke`); the loop reconciles whenever the flag is set and
clears it first, so any number of pokes during a reconcile make exactly one
more. One loop per object means one reconcile at a time per object, with no
lock.

The loop stays inside kopf's model: kopf starts it for every InferenceService
(created, or found when the operator starts or resumes), stops it when the
object is deleted or the operator pauses or exits, and holds its finalizer
until the loop has stopped, so nothing is recreated for an object on its way
out. A transient API error (`kopf.TemporaryError`) leaves the loop and kopf
starts it again after the error's delay; every start reconciles at once. A
permanent one (`kopf.PermanentError`: the API server refused a request) is
posted as a `ReconcileFailed` event and not retried until the spec or a child
changes, which is what wakes the loop anyway.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf

from frota.api import InferenceServiceStatus
from frota.api.contract import ConditionType, EventReason
from frota.operator.loop import fleet_key
from frota.operator.loop.reconcile import Outcome, reconcile
from frota.operator.loop.state import Key, OperatorState, key_of, plain
from frota.operator.reports.status import parse_status


async def run(body: kopf.Body, state: OperatorState, *, logger: Any,
              stopped: kopf.DaemonStopped) -> None:
    """Reconcile one InferenceService whenever it may need work, until kopf stops the loop."""
    key = key_of(body)
    wake = state.wakeup(key)
    recheck: float | None = None
    try:
        while True:
            await _woken(wake, stopped, recheck)
            if stopped:
                break
            wake.clear()
            try:
                outcome = await reconcile_once(body, state)
            except kopf.PermanentError as exc:
                logger.error(f"reconcile failed; waiting for the next change: {exc}")
                recheck = None
            else:
                # Some writes are not in the cache yet: look again once it has caught up.
                recheck = state.settings.recheck_delay_seconds if outcome.recheck else None
            state.idle(key)
    except asyncio.CancelledError:
        state.unwatch(key, wake)
        raise
    # Other errors leave the loop with its flag set: kopf starts it again after
    # the error's delay (or its backoff), and the start reconciles.
    state.unwatch(key, wake)


async def _woken(wake: asyncio.Event, stopped: kopf.DaemonStopped,
                 timeout: float | None) -> None:
    """Until the flag is set, kopf asks the loop to stop, or `timeout` passes."""
    if wake.is_set():
        return
    waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())}
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def reconcile_once(body: kopf.Body, state: OperatorState) -> Outcome:
    """One reconcile of the body as it is now, counted in the operator's metrics."""
    key = key_of(body)
    snapshot = plain(body)
    metrics = state.metrics
    old = state.last_status.get(key)
    old = old if old is not None else parse_status(snapshot.get("status"))
    started = time.perf_counter()
    try:
        # Before the first reconcile applies the pods that mount it (once per object).
        await fleet_key.ensure_once(state.kube, snapshot, state.fleet_keys)
        outcome = await reconcile(snapshot, state.children(key), api=state.kube,
                                  old_status=old, applied=state.applied,
                                  reported_kv=_reported_kv(state, key, old),
                                  reported_adapters=state.reported_adapters.get(key),
                                  cache_progress=state.cache_progress.get(key))
    except kopf.TemporaryError:
        metrics.reconciles.labels("retry").inc()
        raise
    except kopf.PermanentError as exc:
        metrics.reconciles.labels("error").inc()
        # Retrying cannot help: say so where users look.
        kopf.event(snapshot, type="Warning", reason=EventReason.RECONCILE_FAILED,
                   message=f"{exc}; not retrying until the spec or cluster changes")
        raise
    except Exception:
        metrics.reconciles.labels("error").inc()
        raise
    finally:
        metrics.duration.observe(time.perf_counter() - started)
    if outcome.status is not None:
        state.last_status[key] = outcome.status
        ready = any(c.type == ConditionType.READY and c.status == "True"
                    for c in outcome.status.conditions)
        metrics.ready.labels(*key).set(1 if ready else 0)
    metrics.reconciles.labels(outcome.result).inc()
    for ref in outcome.applied:
        metrics.applied.labels(ref.split("/", 1)[0]).inc()
    for cause in outcome.restarted.values():
        metrics.group_restarts.labels(cause).inc()
    return outcome


def _reported_kv(state: OperatorState, key: Key, old: InferenceServiceStatus) -> int | None:
    """The KV cache the engines last reported; until the capacity timer has looked (a
    restarted operator), what status says, so a restart rewrites nothing."""
    if key in state.reported_kv:
        return state.reported_kv[key]
    return old.capacity.reportedKvCacheTokensPerReplica if old.capacity else None
