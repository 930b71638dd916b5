"""The operator's settings: built once by `frota operator` and handed to the handlers.

Nothing reads them from the environment or at import: `frota.operator.cli`
builds an `OperatorSettings` from its flags, `handlers.registry(settings)`
registers the handlers with them (the timers' intervals are fixed when kopf
registers them), and the handlers find them in kopf's memo.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSettings:
    """How one operator process behaves."""

    # What it watches: these namespaces (globs allowed), or every namespace when empty.
    namespaces: tuple[str, ...] = ()
    # How often autoscaled InferenceServices read their metrics (`--autoscale-interval`).
    autoscale_interval_seconds: float = 15.0
    # How often every InferenceService reads the KV cache its serving engines report
    # (`--capacity-report-interval`; status.capacity.reportedKvCacheTokensPerReplica).
    capacity_report_interval_seconds: float = 30.0
    # How often each InferenceService's fleet key Secret is created again if it is missing
    # (a user deleted it); it is made before the first pods either way.
    fleet_key_check_seconds: float = 60.0
    # How long kopf waits before retrying a reconcile that hit a transient API error.
    retry_delay_seconds: float = 5.0
    # How soon to look again at writes the watch cache has not shown yet.
    recheck_delay_seconds: float = 2.0
    # One scrape of a router's or a worker's /metrics.
    scrape_timeout_seconds: float = 5.0
    # One Kubernetes API request of the operator's own (kopf's default for its requests).
    request_timeout_seconds: float = 300.0
    # The operator's own API requests in flight at once, across all reconciles. Each can
    # open a TLS connection (about 130 KiB of buffers) and a burst of creates would
    # otherwise open hundreds; a few keep the API server busy.
    max_concurrent_requests: int = 16
    # kopf: how long the API server holds a watch open, and objects handled at once.
    watch_timeout_seconds: int = 270
    worker_limit: int = 64

    @property
    def peering_namespaces(self) -> list[str] | None:
        """Where the peering object lives: these namespaces, or None for the cluster-wide one."""
        return list(self.namespaces) or None
