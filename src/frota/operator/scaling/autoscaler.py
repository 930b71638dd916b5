"""One autoscaling tick of one InferenceService: read metrics, decide, write, announce.

The decisions are `frota.operator.scaling.decisions`'s pure functions; this module
does the I/O around them: it scrapes the router (spec.replicas) or every
ready rank-0 worker of a role at once, over the operator's one metrics
session, keeps each scaler's `History` in the operator state between ticks,
and patches the spec, with one event and one metric per change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import kopf

from frota.api import Autoscaling, InferenceService, ScalingPolicy
from frota.api.contract import EventReason
from frota.operator.loop.state import OperatorState
from frota.operator.scaling.decisions import (
    ROLES,
    History,
    bounds_of,
    per_group_value,
    per_replica_value,
    settled,
    step,
    zero_decision,
)


async def read_metrics(session: aiohttp.ClientSession, url: str) -> str | None:
    """One /metrics text; None when it cannot be read (no decision then)."""
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


async def read_all(session: aiohttp.ClientSession, urls: Sequence[str]) -> list[str]:
    """Every /metrics text that could be read, fetched at once (each within the
    session's timeout, so the whole read takes about one timeout at most)."""
    texts = await asyncio.gather(*(read_metrics(session, u) for u in urls))
    return [t for t in texts if t is not None]


async def tick(isvc: InferenceService, pods: Sequence[Mapping[str, Any]], state: OperatorState,
               *, logger: Any) -> int | None:
    """Scale spec.replicas, then each autoscaled role; returns the new spec.replicas if changed."""
    spec = isvc.spec
    changed = None
    if spec.autoscaling is not None:
        changed = await _scale(isvc, "", spec.autoscaling, spec.replicas, pods, state,
                               logger=logger)
    for role in ROLES:
        role_spec = getattr(spec.disaggregation, role) if spec.disaggregation else None
        if role_spec is not None and role_spec.autoscaling is not None:
            await _scale(isvc, role, role_spec.autoscaling, role_spec.replicas, pods, state,
                         logger=logger)
    return changed


async def wake_from_zero(isvc: InferenceService, state: OperatorState, *, logger: Any) -> bool:
    """One replica for a fleet scaled to zero whose router holds a request; True if patched."""
    autoscaling = isvc.spec.autoscaling
    if autoscaling is None or autoscaling.scale_to_zero() is None or isvc.spec.replicas != 0:
        return False
    namespace, name = isvc.metadata.namespace or "default", isvc.metadata.name
    await state.kube.patch_spec_replicas(namespace, name, 1)
    key = (namespace, name, "")
    history = state.scalers.get(key, History())
    state.scalers[key] = replace(history, last_scaled=(time.monotonic(), 1), recommendations=())
    state.metrics.desired_replicas.labels(namespace, name, "").set(1)
    _announce(isvc, state, role="", current=0, wanted=1, why="the router holds a request")
    logger.info("scaled up from zero: the router holds a request")
    return True


async def _scale(isvc: InferenceService, role: str, autoscaling: ScalingPolicy, current: int,
                 pods: Sequence[Mapping[str, Any]], state: OperatorState, *,
                 logger: Any) -> int | None:
    """One scaler: spec.replicas from the router (role ""), or one role's groups per unit
    from its own workers. Returns the new replicas if they changed."""
    if state.http is None:
        return None  # not started yet, or shutting down: the metrics session is closed
    namespace, name = isvc.metadata.namespace or "default", isvc.metadata.name
    if role:
        urls = state.role_metrics_urls(pods, role)
        texts = await read_all(state.http, urls)
        where = f"autoscaling {role}: no worker metrics at {urls}"
    else:
        url = state.metrics_url(isvc)
        text = await read_metrics(state.http, url) if url else None
        texts = [text] if text is not None else []
        where = f"autoscaling: router metrics unavailable at {url}"
    if not texts:
        logger.debug(f"{where}; no decision")
        return None
    key = (namespace, name, role)
    history = state.scalers.get(key, History())
    now = time.monotonic()
    if not settled(history, current, now, state.settings.autoscale_interval_seconds):
        return None
    to_zero = autoscaling.scale_to_zero() if isinstance(autoscaling, Autoscaling) else None
    if to_zero is not None:
        wanted = zero_decision(current, texts[0], to_zero, time.time())
        if wanted is not None and wanted != current:
            await state.kube.patch_spec_replicas(namespace, name, wanted)
            state.scalers[key] = replace(history, last_scaled=(now, wanted), recommendations=())
            state.metrics.desired_replicas.labels(namespace, name, role).set(wanted)
            why = ("requests held at zero" if wanted else
                   f"no request for {to_zero.idleSeconds}s (scaleToZero.idleSeconds)")
            _announce(isvc, state, role=role, current=current, wanted=wanted, why=why)
            return wanted
        if current == 0:
            return None  # idle at zero: nothing to measure until a request comes
    metric = autoscaling.metric
    if role:
        value, history = per_group_value(texts, metric, history)
    else:
        value, history = per_replica_value(texts[0], metric, current, history)
    bounds = bounds_of(autoscaling)
    wanted, history = step(current, value, bounds, history, now)
    state.scalers[key] = history
    state.metrics.desired_replicas.labels(namespace, name, role).set(wanted)
    if wanted == current:
        return None
    if role:
        await state.kube.patch_role_replicas(namespace, name, role, wanted)
    else:
        await state.kube.patch_spec_replicas(namespace, name, wanted)
    state.scalers[key] = replace(history, last_scaled=(now, wanted))
    per = "group" if role else "replica"
    _announce(isvc, state, role=role, current=current, wanted=wanted,
              why=f"{metric}={value} per {per}, target {bounds.target}")
    return wanted


def _announce(isvc: InferenceService, state: OperatorState, *, role: str, current: int,
              wanted: int, why: str) -> None:
    """The metric and the event of one change."""
    direction = "up" if wanted > current else "down"
    state.metrics.scale_decisions.labels(role, direction).inc()
    who = f"autoscaling {role}" if role else "autoscaling"
    what = f"{role} groups per unit" if role else "replicas"
    kopf.event(
        _reference(isvc), type="Normal",
        reason=EventReason.SCALED_UP if direction == "up" else EventReason.SCALED_DOWN,
        message=f"{who}: {current} -> {wanted} {what} ({why})",
    )


def _reference(isvc: InferenceService) -> dict[str, Any]:
    """What kopf needs to post an event about an object."""
    meta = isvc.metadata
    return {"apiVersion": isvc.apiVersion, "kind": isvc.kind,
            "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid}}
