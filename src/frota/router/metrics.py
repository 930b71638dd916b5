"""The router's Prometheus metrics (names: frota.api.contract.RouterMetric), a registry per app."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from functools import partial

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from frota.api.contract import RouterMetric
from frota.router.loop_metrics import Counter, Gauge, Histogram, ReadGauge

# Buckets tuned for an LLM proxy: sub-millisecond overhead up to minute-long generations.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)
# With `--processes N`, every sample carries the process that counted it (0 to N-1).
PROCESS_LABEL = "process"


class RouterMetrics:
    """Every metric the router exports. One instance per app, on its own registry,
    so tests (and two routers in one process) never share counters. Lock-free, for
    the router's one event loop (`frota.router.loop_metrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # Every metric on this app's registry; latency histograms share one bucket set.
        counter = partial(Counter, registry=self.registry)
        gauge = partial(Gauge, registry=self.registry)
        histogram = partial(Histogram, buckets=LATENCY_BUCKETS, registry=self.registry)
        by_worker = ["worker"]
        self.requests = counter(RouterMetric.REQUESTS,
                                "Requests answered, by endpoint and HTTP status.",
                                ["endpoint", "status"])
        self.decisions = counter(RouterMetric.ROUTING_DECISIONS,
                                 "Routing decisions, by policy, decision kind and chosen worker.",
                                 ["policy", "decision", "worker"])
        self.rejections = counter(RouterMetric.REJECTIONS,
                                  "Requests refused by admission control (429), by reason.",
                                  ["reason"])
        self.retries = counter(RouterMetric.RETRIES,
                               "Upstream attempts retried on another replica, by reason.",
                               ["reason"])
        self.stream_errors = counter(
            RouterMetric.STREAM_ERRORS,
            "Streams that failed after their first byte and were ended with an error event.")
        self.ejections = counter(RouterMetric.EJECTIONS,
                                 "Workers taken out of rotation, by worker.", by_worker)
        self.readmissions = counter(RouterMetric.READMISSIONS,
                                    "Ejected workers put back into rotation, by worker.",
                                    by_worker)
        self.worker_healthy = gauge(RouterMetric.WORKER_HEALTHY,
                                    "1 when the worker is in rotation, else 0.", by_worker)
        # Read from each worker's count when scraped (`WorkerPool` says how).
        self.worker_outstanding = ReadGauge(
            RouterMetric.WORKER_OUTSTANDING_REQUESTS,
            "Requests the router has in flight on each worker.", by_worker,
            registry=self.registry)
        # Read from the admission controller's counts when scraped.
        self.inflight = ReadGauge(RouterMetric.INFLIGHT_REQUESTS, "Admitted requests in flight.",
                                  registry=self.registry)
        self.queue_depth = ReadGauge(RouterMetric.QUEUE_DEPTH, "Requests waiting for admission.",
                                     registry=self.registry)
        self.queue_wait = histogram(RouterMetric.QUEUE_WAIT_SECONDS,
                                    "Time spent waiting for admission.")
        self.upstream_latency = histogram(
            RouterMetric.UPSTREAM_LATENCY_SECONDS,
            "Time from sending a request to a worker to its response headers.", by_worker)
        self.request_latency = histogram(
            RouterMetric.E2E_REQUEST_LATENCY_SECONDS,
            "Time from receiving a request to sending its last byte.", ["endpoint"])
        self.ttft = histogram(
            RouterMetric.TIME_TO_FIRST_TOKEN_SECONDS,
            "Time from receiving a streaming request to forwarding its first chunk.")
        self.itl = Histogram(
            RouterMetric.INTER_TOKEN_LATENCY_SECONDS,
            "Time between consecutive chunks of a stream, as forwarded by the router.",
            buckets=ITL_BUCKETS, registry=self.registry)
        # The front door (`frota.router.server`): open client connections, read when
        # scraped, and the ones turned away or cut off for a limit.
        self.connections = ReadGauge(RouterMetric.CONNECTIONS, "Open client connections.",
                                     registry=self.registry)
        self.connections_cut = counter(
            RouterMetric.CONNECTIONS_CUT, "Client connections turned away or cut off, by "
            "reason: max_connections (a 503 before reading), write_timeout (the client took "
            "none of its answer for --write-timeout).", ["reason"])
        self.held = gauge(RouterMetric.HELD_REQUESTS,
                          "Requests held while no worker is ready (scale to zero: a replica starts).")
        # When the last request arrived (the app sets it), read when scraped.
        self.last_request_at = time.time()
        self.last_request = ReadGauge(
            RouterMetric.LAST_REQUEST_TIMESTAMP,
            "When the last request arrived (Unix time; the router's start until one does): "
            "what scale to zero judges idleness by.", registry=self.registry)
        self.last_request.add_reader(lambda: [((), self.last_request_at)])
        self.adapter_loads = counter(
            RouterMetric.ADAPTER_LOADS, "LoRA adapter loads the router made on workers, by "
            "trigger (api: a load through the router, demand: a request for an adapter no "
            "worker held, replay: a worker joining) and result (ok, noop: it was loaded "
            "already, error).",
            ["trigger", "result"])
        self.adapter_unloads = counter(
            RouterMetric.ADAPTER_UNLOADS, "LoRA adapter unloads the router made on workers, "
            "by result (ok, noop: it was not loaded, error).", ["result"])

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merge_processes(texts: Mapping[int, str]) -> bytes:
    """One exposition of several router processes' own, by process index: each family
    once, with every process's samples labelled `process`. Counters stay monotonic per
    process, so `rate()` and `sum by` work as with separate pods."""
    families: dict[str, Metric] = {}
    for index, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            family.samples = [s._replace(labels={**s.labels, PROCESS_LABEL: str(index)})
                              for s in family.samples]
            if family.name in families:
                families[family.name].samples.extend(family.samples)
            else:
                families[family.name] = family
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families(Collector):
    """Families already built (parsed), as a collector for `generate_latest`."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
