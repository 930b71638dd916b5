"""Autoscaling decisions from serving metrics (pure: state in, decision and new state out).

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

With `minReplicas: 0` (scale to zero) spec.replicas also goes to 0 after
`scaleToZero.idleSeconds` with no request: the router's last-request time is that old and
nothing is in flight, queued or held (`zero_decision`). At zero the load-based scaler has
nothing to read; the router holds the requests that arrive and announces the demand in the
fleet's demand ConfigMap (`contract.Demand`, answered at once by `frota.operator.scaling.demand`),
and this tick brings one replica back too if requests are held (the push failed).
Above zero the load-based scaler keeps at least one replica.

Either way the decision is the same pure function: recommend
`ceil(current * value / target)` within [minReplicas, maxReplicas], and apply
it HPA-style: up at once, down only to the highest recommendation seen within
the stabilization window (which starts with the replicas found on the first
tick, so a restarted operator does not scale down at once). Each change is an
event and a metric (label `role`: prefill, decode, or empty for spec.replicas).

`frota.operator.scaling.autoscaler` runs these on the autoscaling timer: it reads
the metrics, keeps each scaler's `History` between ticks and writes the
decisions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from frota.api import InferenceService, InferenceServiceSpec, ScaleToZero, ScalingPolicy
from frota.api.contract import Label, Role, RouterMetric, ServingPath, WorkerMetric
from frota.api.exposition import sample_totals
from frota.operator.builders import service_url
from frota.plan.addressing import WORKER_PORT

TOLERANCE = 0.1  # no change while the metric is within 10% of the target
ROLES = (Role.PREFILL, Role.DECODE)  # the roles with an autoscaling of their own


@dataclass(frozen=True)
class Bounds:
    """spec.autoscaling (or a role's), as the decision needs it."""

    min_replicas: int
    max_replicas: int
    target: float
    stabilization_seconds: float


@dataclass(frozen=True)
class History:
    """What one scaler (spec.replicas, or one role's groups per unit) remembers between ticks."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (when, replicas) within the window
    ttft_totals: tuple[float, float] | None = None  # (sum, count) at the last tick
    last_scaled: tuple[float, int] | None = None  # (when, to how many replicas)


def bounds_of(autoscaling: ScalingPolicy) -> Bounds:
    """The bounds of spec.autoscaling or of a disaggregated role's autoscaling. Scaling to
    zero is `zero_decision`'s: on load, the fewest is one."""
    return Bounds(
        min_replicas=max(autoscaling.minReplicas, 1),
        max_replicas=autoscaling.maxReplicas,
        target=autoscaling.target,
        stabilization_seconds=float(autoscaling.stabilizationWindowSeconds),
    )


def is_autoscaled(spec: InferenceServiceSpec) -> bool:
    """spec.autoscaling or a disaggregated role's autoscaling is set."""
    roles = spec.disaggregation
    return spec.autoscaling is not None or (
        roles is not None and any(getattr(roles, r).autoscaling is not None for r in ROLES)
    )


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
) -> tuple[int, History]:
    """Stabilize: scale up at once; scale down to the window's highest recommendation."""
    window_start = now - bounds.stabilization_seconds
    recent = (*((t, r) for t, r in history.recommendations if t >= window_start),
              (now, recommendation))
    after = replace(history, recommendations=recent)
    if recommendation >= current:
        return recommendation, after
    return min(current, max(r for _, r in recent)), after


def step(current: int, value: float | None, bounds: Bounds, history: History,
         now: float) -> tuple[int, History]:
    """recommend + decide, with the window seeded by the replicas found on the first tick
    (so a restarted operator does not scale down at once)."""
    if not history.recommendations:
        history = replace(history, recommendations=((now, current),))
    return decide(current, recommend(current, value, bounds), history, bounds, now)


def settled(history: History, current: int, now: float, interval: float) -> bool:
    """False while our last change has not reached the spec yet (judge it next time)."""
    if history.last_scaled is None:
        return True
    when, replicas = history.last_scaled
    return replicas == current or now - when >= 4 * interval


def zero_decision(current: int, metrics_text: str, settings: ScaleToZero, now: float) -> int | None:
    """Scale to zero from the router's /metrics: 0 once idle for `idleSeconds` (`now`: wall
    time, as the router's last-request timestamp), 1 at zero while requests are held, else
    None (at zero: stay; above: the load-based scaler decides)."""
    samples = sample_totals(metrics_text)
    held = samples.get(RouterMetric.HELD_REQUESTS, 0.0)
    if current == 0:
        return 1 if held > 0 else None
    busy = (held + samples.get(RouterMetric.INFLIGHT_REQUESTS, 0.0)
            + samples.get(RouterMetric.QUEUE_DEPTH, 0.0))
    last = samples.get(RouterMetric.LAST_REQUEST_TIMESTAMP)
    if last is not None and busy == 0 and now - last >= settings.idleSeconds:
        return 0
    return None


def _ttft_since_last(total: float | None, count: float | None,
                     history: History) -> tuple[float | None, History]:
    """Mean time to first token since the previous tick, from a histogram's totals."""
    if total is None or count is None:
        return None, history
    previous, after = history.ttft_totals, replace(history, ttft_totals=(total, count))
    if previous is None or count <= previous[1] or total < previous[0]:
        return None, after  # no new first tokens (or a worker restarted): nothing to judge
    return (total - previous[0]) / (count - previous[1]), after


def per_replica_value(metrics_text: str, metric: str, replicas: int,
                      history: History) -> tuple[float | None, History]:
    """The metric the target is compared against, from the router's exposition text."""
    samples = sample_totals(metrics_text)
    if metric == "ttft":
        return _ttft_since_last(samples.get(RouterMetric.TIME_TO_FIRST_TOKEN_SECONDS + "_sum"),
                                samples.get(RouterMetric.TIME_TO_FIRST_TOKEN_SECONDS + "_count"),
                                history)
    waiting = samples.get(RouterMetric.QUEUE_DEPTH, 0.0)
    in_flight = samples.get(RouterMetric.WORKER_OUTSTANDING_REQUESTS, 0.0)
    return (waiting + in_flight) / max(replicas, 1), history


def per_group_value(metrics_texts: list[str], metric: str,
                    history: History) -> tuple[float | None, History]:
    """One role's metric per group, from the /metrics of its groups' rank-0 workers.

    queueDepth: requests waiting plus running, averaged over the groups that
    answered; ttft: the role's mean time to first token since the last tick.
    None when no worker answered (no decision then).
    """
    if not metrics_texts:
        return None, history
    totals: dict[str, float] = {}
    for text in metrics_texts:
        for name, value in sample_totals(text).items():
            totals[name] = totals.get(name, 0.0) + value
    if metric == "ttft":
        return _ttft_since_last(totals.get(WorkerMetric.TIME_TO_FIRST_TOKEN_SECONDS + "_sum"),
                                totals.get(WorkerMetric.TIME_TO_FIRST_TOKEN_SECONDS + "_count"), history)
    busy = (totals.get(WorkerMetric.NUM_REQUESTS_WAITING, 0.0)
            + totals.get(WorkerMetric.NUM_REQUESTS_RUNNING, 0.0))
    return busy / len(metrics_texts), history


def role_metrics_urls(pods: Iterable[Mapping[str, Any]], role: str) -> list[str]:
    """The engine /metrics of the rank-0 pod of every ready group of one role."""
    urls = []
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if (labels.get(Label.ROLE) == role and labels.get(Label.POD_INDEX) == "0" and ready
                and status.get("podIP") and not pod.get("metadata", {}).get("deletionTimestamp")):
            urls.append(f"http://{status['podIP']}:{WORKER_PORT}{ServingPath.METRICS}")
    return sorted(urls)


def metrics_url(isvc: InferenceService) -> str:
    """The router's metrics endpoint: beside the OpenAI base URL its Service serves."""
    return service_url(isvc).removesuffix("/").removesuffix("/v1") + ServingPath.METRICS
