"""`least-load`: the worker with the least work on it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import StrEnum

from frota.router.health import Worker
from frota.router.policies.base import Decision, PolicyName, RouteRequest, RoutingPolicy


class LoadSignal(StrEnum):
    """What `least-load` measures (`--load-signal`)."""

    OUTSTANDING = "outstanding"  # requests this router has in flight on the worker
    METRICS = "metrics"          # the worker's own vllm gauges, scraped from /metrics


class LeastLoadPolicy(RoutingPolicy):
    """Send each request to the least loaded worker; ties go round-robin.

    With `outstanding`, load is the number of requests this router has in flight
    on the worker: exact and instant, but blind to other routers. With `metrics`,
    load is `vllm:num_requests_running + vllm:num_requests_waiting` as last
    scraped (never less than this router's own in-flight count, which covers the
    time between scrapes), plus `vllm:kv_cache_usage_perc` (0..1) to break ties
    towards the worker with more free cache. Stale scrapes (older than
    `max_metrics_age` seconds) fall back to the outstanding count.
    """

    name = PolicyName.LEAST_LOAD

    def __init__(self, signal: LoadSignal = LoadSignal.OUTSTANDING,
                 max_metrics_age: float = 10.0) -> None:
        self.signal = LoadSignal(signal)
        self.needs_worker_metrics = self.signal is LoadSignal.METRICS
        self.max_metrics_age = max_metrics_age
        self._tiebreak = 0

    def load_of(self, worker: Worker, now: float) -> float:
        if self.signal is LoadSignal.OUTSTANDING:
            return float(worker.num_outstanding)
        load = worker.load
        if not load.scraped_at or now - load.scraped_at > self.max_metrics_age:
            return float(worker.num_outstanding)
        return max(load.num_running + load.num_waiting, worker.num_outstanding) + load.kv_usage

    def choose(self, request: RouteRequest, candidates: Sequence[Worker]) -> Decision:
        now = time.monotonic()
        n = len(candidates)
        self._tiebreak = (self._tiebreak + 1) % n
        best = min(range(n), key=lambda i: (self.load_of(candidates[i], now),
                                            (i - self._tiebreak) % n))
        return Decision(candidates[best], f"least_{self.signal.value}")
