"""The operator's own Prometheus metrics (`frota_operator_*`) and its health endpoint."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    """Counters and histograms of one operator process, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "frota_operator_reconciles_total",
            "Reconciles of InferenceServices by result "
            "(converged, progressing, invalid, retry, error).",
            ["result"], registry=self.registry,
        )
        self.duration = Histogram(
            "frota_operator_reconcile_duration_seconds",
            "Wall time of one reconcile.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.pending = Gauge(
            "frota_operator_pending_reconciles",
            "InferenceServices with a reconcile queued or running.",
            registry=self.registry,
        )
        self.applied = Counter(
            "frota_operator_applied_objects_total",
            "Child objects written with server-side apply, by kind.",
            ["kind"], registry=self.registry,
        )
        self.group_restarts = Counter(
            "frota_operator_group_restarts_total",
            "Replica groups whose pods were deleted together, by cause (rollout, failure).",
            ["cause"], registry=self.registry,
        )
        self.scale_decisions = Counter(
            "frota_operator_autoscale_decisions_total",
            "Autoscaler decisions that changed replicas, by role (prefill, decode; empty: "
            "spec.replicas) and direction (up, down).",
            ["role", "direction"], registry=self.registry,
        )
        self.desired_replicas = Gauge(
            "frota_operator_autoscale_desired_replicas",
            "Replicas the autoscaler last recommended, per InferenceService and role "
            "(prefill, decode: groups per unit; empty: spec.replicas).",
            ["namespace", "name", "role"], registry=self.registry,
        )
        # What an alert on a fleet that is not Ready reads, without kube-state-metrics.
        self.ready = Gauge(
            "frota_operator_inferenceservice_ready",
            "1 while the InferenceService's Ready condition is True, else 0 (as the operator "
            "last wrote it).",
            ["namespace", "name"], registry=self.registry,
        )
        # Zero from the start: increase() and rate() see the first error or restart only
        # when the series existed before it.
        for result in ("converged", "progressing", "invalid", "retry", "error"):
            self.reconciles.labels(result)
        for cause in ("rollout", "failure"):
            self.group_restarts.labels(cause)
