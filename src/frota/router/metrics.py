"""The router's Prometheus metrics (names: frota.api.contract.RouterMetric), a registry per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from frota.api.contract import RouterMetric

# Buckets tuned for an LLM proxy: sub-millisecond overhead up to minute-long generations.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)


class RouterMetrics:
    """Every metric the router exports. One instance per app, on its own registry,
    so tests (and two routers in one process) never share counters."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            RouterMetric.REQUESTS, "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "status"], registry=r)
        self.decisions = Counter(
            RouterMetric.ROUTING_DECISIONS,
            "Routing decisions, by policy, decision kind and chosen worker.",
            ["policy", "decision", "worker"], registry=r)
        self.rejections = Counter(
            RouterMetric.REJECTIONS, "Requests refused by admission control (429), by reason.",
            ["reason"], registry=r)
        self.retries = Counter(
            RouterMetric.RETRIES, "Upstream attempts retried on another replica, by reason.",
            ["reason"], registry=r)
        self.stream_errors = Counter(
            RouterMetric.STREAM_ERRORS,
            "Streams that failed after their first byte and were ended with an error event.",
            registry=r)
        self.ejections = Counter(
            RouterMetric.EJECTIONS, "Workers taken out of rotation, by worker.",
            ["worker"], registry=r)
        self.readmissions = Counter(
            RouterMetric.READMISSIONS, "Ejected workers put back into rotation, by worker.",
            ["worker"], registry=r)
        self.worker_healthy = Gauge(
            RouterMetric.WORKER_HEALTHY, "1 when the worker is in rotation, else 0.",
            ["worker"], registry=r)
        self.worker_outstanding = Gauge(
            RouterMetric.WORKER_OUTSTANDING_REQUESTS,
            "Requests the router has in flight on each worker.", ["worker"], registry=r)
        self.inflight = Gauge(
            RouterMetric.INFLIGHT_REQUESTS, "Admitted requests in flight.", registry=r)
        self.queue_depth = Gauge(
            RouterMetric.QUEUE_DEPTH, "Requests waiting for admission.", registry=r)
        self.queue_wait = Histogram(
            RouterMetric.QUEUE_WAIT_SECONDS, "Time spent waiting for admission.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_latency = Histogram(
            RouterMetric.UPSTREAM_LATENCY_SECONDS,
            "Time from sending a request to a worker to its response headers.",
            ["worker"], buckets=LATENCY_BUCKETS, registry=r)
        self.request_latency = Histogram(
            RouterMetric.E2E_REQUEST_LATENCY_SECONDS,
            "Time from receiving a request to sending its last byte.",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(
            RouterMetric.TIME_TO_FIRST_TOKEN_SECONDS,
            "Time from receiving a streaming request to forwarding its first chunk.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(
            RouterMetric.INTER_TOKEN_LATENCY_SECONDS,
            "Time between consecutive chunks of a stream, as forwarded by the router.",
            buckets=ITL_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
