"""Autoscaling spec.replicas from the router's metrics (a pure decision plus a timer tick).

Each tick reads the router's /metrics, turns it into one value per replica
(queue depth: requests waiting at the router plus those in flight at the
workers; ttft: mean time to first token since the last tick), recommends
`ceil(current * value / target)` within [minReplicas, maxReplicas], and
applies it HPA-style: up at once, down only to the highest recommendation
seen within the stabilization window. Each change is an event and a metric.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import kopf
from frota.operator import apply as api
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from frota.operator.workqueue import Fleet

# Read once at import (kopf timers are registered then): `frota operator
# --autoscale-interval` sets it before the handlers are imported.
INTERVAL_SECONDS = float(os.environ.get("FROTA_AUTOSCALE_INTERVAL_SECONDS", "15"))
TOLERANCE = 0.1  # no change while the metric is within 10% of the target


@dataclass(frozen=True)
class Bounds:
    """spec.autoscaling, as the decision needs it."""

    min_replicas: int
    max_replicas: int
    target: float
    stabilization_seconds: float


@dataclass
class History:
    """Recommendations of one InferenceService over time, and the last TTFT totals."""

    recommendations: list[tuple[float, int]] = field(default_factory=list)
    ttft_totals: tuple[float, float] | None = None  # (sum, count)
    last_scaled: tuple[float, int] | None = None  # (when, to how many replicas)


def recommend(current: int, value: float | None, bounds: Bounds) -> int:
    """Replicas that bring the per-replica metric to the target (within bounds and tolerance)."""
    current_bounded = min(max(current, bounds.min_replicas), bounds.max_replicas)
    if value is None or current <= 0:
        return current_bounded
    ratio = value / bounds.target
    if abs(ratio - 1.0) <= TOLERANCE:
        return current_bounded
    wanted = math.ceil(current * ratio)
    return min(max(wanted, bounds.min_replicas), bounds.max_replicas)


def decide(
    current: int, recommendation: int, history: History, bounds: Bounds, now: float
) -> int:
    """Stabilize: scale up at once; scale down to the window's highest recommendation."""
    window_start = now - bounds.stabilization_seconds
    history.recommendations = [
        (t, r) for t, r in history.recommendations if t >= window_start
    ] + [(now, recommendation)]
    if recommendation >= current:
        return recommendation
    return min(current, max(r for _, r in history.recommendations))


def per_replica_value(
    metrics_text: str, metric: str, replicas: int, history: History
) -> float | None:
    """The metric the target is compared against, from the router's exposition text."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    if metric == "ttft":
        total = samples.get("frota_router_time_to_first_token_seconds_sum")
        count = samples.get("frota_router_time_to_first_token_seconds_count")
        if total is None or count is None:
            return None
        previous, history.ttft_totals = history.ttft_totals, (total, count)
        if previous is None or count <= previous[1]:
            return None  # no new first tokens since the last tick: nothing to judge
        return (total - previous[0]) / (count - previous[1])
    waiting = samples.get("frota_router_queue_depth", 0.0)
    in_flight = samples.get("frota_router_worker_outstanding_requests", 0.0)
    return (waiting + in_flight) / max(replicas, 1)


def bounds_of(spec: Mapping[str, Any]) -> Bounds:
    auto = spec.get("autoscaling") or {}
    return Bounds(
        min_replicas=int(auto.get("minReplicas", 1)),
        max_replicas=int(auto["maxReplicas"]),
        target=float(auto["target"]),
        stabilization_seconds=float(auto.get("stabilizationWindowSeconds", 300)),
    )


def metrics_url(body: Mapping[str, Any]) -> str | None:
    """The router's metrics endpoint: beside the OpenAI base URL that status reports."""
    url = (body.get("status") or {}).get("url")
    return url.removesuffix("/").removesuffix("/v1") + "/metrics" if url else None


async def read_metrics(url: str) -> str | None:
    """Fetch the router's metrics; None when it cannot be reached (no decision then)."""
    try:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


async def tick(body: Mapping[str, Any], *, fleet: Fleet, logger: Any) -> int | None:
    """One autoscaling step for one InferenceService; returns the new replicas if changed."""
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, name = meta.get("namespace") or "default", meta["name"]
    bounds = bounds_of(spec)
    current = int(spec.get("replicas", 1))
    url = fleet.metrics_url(body)
    text = await read_metrics(url) if url else None
    if text is None:
        logger.debug(f"autoscaling: router metrics unavailable at {url}; no decision")
        return None
    history = fleet.autoscale_history.setdefault((namespace, name), History())
    now = time.monotonic()
    if history.last_scaled is not None:
        when, replicas = history.last_scaled
        if replicas != current and now - when < 4 * INTERVAL_SECONDS:
            return None  # our last change has not reached this body yet: judge it next time
    value = per_replica_value(text, spec["autoscaling"].get("metric", "queueDepth"), current,
                              history)
    wanted = decide(current, recommend(current, value, bounds), history, bounds, now)
    fleet.metrics.desired_replicas.labels(namespace, name).set(wanted)
    if wanted == current:
        return None
    await api.patch_spec_replicas(namespace, name, wanted, logger=logger)
    history.last_scaled = (now, wanted)
    direction = "up" if wanted > current else "down"
    fleet.metrics.scale_decisions.labels(direction).inc()
    kopf.event(
        dict(body), type="Normal", reason=f"Scaled{direction.capitalize()}",
        message=f"autoscaling: {current} -> {wanted} replicas "
                f"({spec['autoscaling'].get('metric', 'queueDepth')}={value} per replica, "
                f"target {bounds.target})",
    )
    return wanted
