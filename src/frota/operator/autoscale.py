"""Autoscaling from serving metrics (a pure decision plus a timer tick).

`spec.autoscaling` scales spec.replicas (replica groups, or disaggregated
units) from the router's /metrics: one value per replica (queue depth:
requests waiting at the router plus those in flight at the workers; ttft:
mean time to first token since the last tick).

`spec.disaggregation.<role>.autoscaling` scales that role's groups per unit
(spec.disaggregation.<role>.replicas) on the role's own signal. The router's
queue and TTFT are not split by role, so each role is read from its own
workers instead: the rank-0 pod of every ready group of the role serves the
engine's /metrics (queue depth: `vllm:num_requests_waiting` plus
`vllm:num_requests_running`, averaged over the groups that answered; ttft:
the mean of `vllm:time_to_first_token_seconds` since the last tick). Each role
keeps its own stabilization history, so prefill and decode scale independently.

Either way the decision is the same pure function: recommend
`ceil(current * value / target)` within [minReplicas, maxReplicas], and apply
it HPA-style: up at once, down only to the highest recommendation seen within
the stabilization window (which starts with the replicas found on the first
tick, so a restarted operator does not scale down at once). Each change is an
event and a metric (label `role`: prefill, decode, or empty for spec.replicas).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import kopf
from prometheus_client.parser import text_string_to_metric_families

from frota.api.contract import EventReason, Label
from frota.operator import apply as api
from frota.operator.topology import WORKER_PORT

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
    roles: dict[str, History] = field(default_factory=dict)  # per disaggregated role


ROLES = ("prefill", "decode")


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


def _sums(metrics_text: str) -> dict[str, float]:
    """Every sample of an exposition text, summed over its labels, by sample name."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def _ttft_since_last(total: float | None, count: float | None, history: History) -> float | None:
    """Mean time to first token since the previous tick, from a histogram's totals."""
    if total is None or count is None:
        return None
    previous, history.ttft_totals = history.ttft_totals, (total, count)
    if previous is None or count <= previous[1] or total < previous[0]:
        return None  # no new first tokens (or a worker restarted): nothing to judge
    return (total - previous[0]) / (count - previous[1])


def per_replica_value(
    metrics_text: str, metric: str, replicas: int, history: History
) -> float | None:
    """The metric the target is compared against, from the router's exposition text."""
    samples = _sums(metrics_text)
    if metric == "ttft":
        return _ttft_since_last(samples.get("frota_router_time_to_first_token_seconds_sum"),
                                samples.get("frota_router_time_to_first_token_seconds_count"),
                                history)
    waiting = samples.get("frota_router_queue_depth", 0.0)
    in_flight = samples.get("frota_router_worker_outstanding_requests", 0.0)
    return (waiting + in_flight) / max(replicas, 1)


def per_group_value(metrics_texts: list[str], metric: str, history: History) -> float | None:
    """One role's metric per group, from the /metrics of its groups' rank-0 workers.

    queueDepth: requests waiting plus running, averaged over the groups that
    answered; ttft: the role's mean time to first token since the last tick.
    None when no worker answered (no decision then).
    """
    if not metrics_texts:
        return None
    totals: dict[str, float] = {}
    for text in metrics_texts:
        for name, value in _sums(text).items():
            totals[name] = totals.get(name, 0.0) + value
    if metric == "ttft":
        return _ttft_since_last(totals.get("vllm:time_to_first_token_seconds_sum"),
                                totals.get("vllm:time_to_first_token_seconds_count"), history)
    busy = totals.get("vllm:num_requests_waiting", 0.0) + totals.get("vllm:num_requests_running", 0.0)
    return busy / len(metrics_texts)


def bounds_of(spec: Mapping[str, Any]) -> Bounds:
    """The bounds of a spec (or a disaggregated role's spec) with `autoscaling` set."""
    auto = spec.get("autoscaling") or {}
    return Bounds(
        min_replicas=int(auto.get("minReplicas", 1)),
        max_replicas=int(auto["maxReplicas"]),
        target=float(auto["target"]),
        stabilization_seconds=float(auto.get("stabilizationWindowSeconds", 300)),
    )


def role_metrics_urls(body: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
                      role: str) -> list[str]:
    """The engine /metrics of the rank-0 pod of every ready group of one role."""
    del body  # the pods are the InferenceService's own (from the operator's index)
    urls = []
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if (labels.get(Label.ROLE) == role and labels.get(Label.POD_INDEX) == "0" and ready
                and status.get("podIP") and not pod.get("metadata", {}).get("deletionTimestamp")):
            urls.append(f"http://{status['podIP']}:{WORKER_PORT}/metrics")
    return sorted(urls)


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


def _settled(history: History, current: int, now: float) -> bool:
    """False while our last change has not reached the body yet (judge it next time)."""
    if history.last_scaled is None:
        return True
    when, replicas = history.last_scaled
    return replicas == current or now - when >= 4 * INTERVAL_SECONDS


def _decide(current: int, value: float | None, bounds: Bounds, history: History,
            now: float) -> int:
    """recommend + decide, with the window seeded by the replicas of the first tick."""
    if not history.recommendations:
        history.recommendations.append((now, current))
    return decide(current, recommend(current, value, bounds), history, bounds, now)


def _announce(body: Mapping[str, Any], fleet: Fleet, *, role: str, current: int, wanted: int,
              what: str, metric: str, value: float | None, target: float) -> None:
    """The metric and the event of one change."""
    direction = "up" if wanted > current else "down"
    fleet.metrics.scale_decisions.labels(role, direction).inc()
    who = f"autoscaling {role}" if role else "autoscaling"
    kopf.event(
        dict(body), type="Normal", reason=EventReason.SCALED_UP if direction == "up" else EventReason.SCALED_DOWN,
        message=f"{who}: {current} -> {wanted} {what} ({metric}={value} per "
                f"{'group' if role else 'replica'}, target {target})",
    )


async def tick(body: Mapping[str, Any], *, fleet: Fleet, logger: Any) -> int | None:
    """One autoscaling step for one InferenceService: spec.replicas, then each autoscaled role.

    Returns the new spec.replicas if it changed.
    """
    spec = body.get("spec") or {}
    changed = await tick_replicas(body, fleet=fleet, logger=logger) if spec.get("autoscaling") else None
    for role in ROLES:
        if ((spec.get("disaggregation") or {}).get(role) or {}).get("autoscaling"):
            await tick_role(body, role, fleet=fleet, logger=logger)
    return changed


async def tick_replicas(body: Mapping[str, Any], *, fleet: Fleet, logger: Any) -> int | None:
    """Scale spec.replicas from the router's metrics; returns the new replicas if changed."""
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
    if not _settled(history, current, now):
        return None
    metric = spec["autoscaling"].get("metric", "queueDepth")
    value = per_replica_value(text, metric, current, history)
    wanted = _decide(current, value, bounds, history, now)
    fleet.metrics.desired_replicas.labels(namespace, name, "").set(wanted)
    if wanted == current:
        return None
    await api.patch_spec_replicas(namespace, name, wanted, logger=logger)
    history.last_scaled = (now, wanted)
    _announce(body, fleet, role="", current=current, wanted=wanted, what="replicas",
              metric=metric, value=value, target=bounds.target)
    return wanted


async def tick_role(body: Mapping[str, Any], role: str, *, fleet: Fleet,
                    logger: Any) -> int | None:
    """Scale spec.disaggregation.<role>.replicas from the role's own workers' metrics."""
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, name = meta.get("namespace") or "default", meta["name"]
    role_spec = spec["disaggregation"][role]
    bounds = bounds_of(role_spec)
    current = int(role_spec.get("replicas", 1))
    urls = fleet.role_metrics_urls(body, fleet.children((namespace, name)).pods, role)
    texts = [t for t in [await read_metrics(u) for u in urls] if t is not None]
    if not texts:
        logger.debug(f"autoscaling {role}: no worker metrics at {urls}; no decision")
        return None
    history = fleet.autoscale_history.setdefault((namespace, name), History())
    history = history.roles.setdefault(role, History())
    now = time.monotonic()
    if not _settled(history, current, now):
        return None
    metric = role_spec["autoscaling"].get("metric", "queueDepth")
    value = per_group_value(texts, metric, history)
    wanted = _decide(current, value, bounds, history, now)
    fleet.metrics.desired_replicas.labels(namespace, name, role).set(wanted)
    if wanted == current:
        return None
    await api.patch_role_replicas(namespace, name, role, wanted, logger=logger)
    history.last_scaled = (now, wanted)
    _announce(body, fleet, role=role, current=current, wanted=wanted,
              what=f"{role} groups per unit", metric=metric, value=value, target=bounds.target)
    return wanted
