"""The router exports every metric family the contract names for other parts to read."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frota.api.contract import RouterMetric
from frota.router import loop_metrics
from frota.router.disagg import DisaggMetrics
from frota.router.metrics import ITL_BUCKETS, RouterMetrics, merge_processes
from frota.router.processes import read_sibling_metrics


def test_every_router_metric_of_the_contract_is_exported() -> None:
    metrics = RouterMetrics()
    DisaggMetrics(metrics.registry)  # registered beside them when the router has a prefill pool
    families = {f.name for f in text_string_to_metric_families(metrics.render().decode())}
    names = {v for k, v in vars(RouterMetric).items() if k.isupper()}
    # the parser names counter families without their `_total` sample suffix, as the contract does
    assert names <= families, names - families
    # and the contract names every family the router registers (one owner for new ones too)
    registered = {m.name for m in metrics.registry.collect()}
    assert registered == names, registered ^ names


def _exposition(registry: CollectorRegistry) -> tuple[list[str], dict[str, float]]:
    """The families in order (name, type, help) and every sample's value, the `_created`
    timestamps left out (they differ by when each was made)."""
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    heads = [f"{f.name} {f.type} {f.documentation}" for f in families]
    values = {f"{s.name}{sorted(s.labels.items())}": s.value for f in families
              for s in f.samples if not s.name.endswith("_created")}
    created = {f"{s.name}{sorted(s.labels.items())}" for f in families
               for s in f.samples if s.name.endswith("_created")}
    return heads, {**values, **dict.fromkeys(created, -1.0)}


def test_loop_metrics_read_as_prometheus_client_metrics_would() -> None:
    ours, reference = CollectorRegistry(), CollectorRegistry()

    def both(kind: str, *args: object, **kwargs: object) -> tuple[object, object]:
        return (getattr(loop_metrics, kind)(*args, registry=ours, **kwargs),
                getattr(prometheus_client, kind)(*args, registry=reference, **kwargs))

    for counter in both("Counter", "c_total", "a counter"):
        counter.inc()
        counter.inc(2.5)
    for counter in both("Counter", "lc", "a labelled counter", ["endpoint", "status"]):
        counter.labels("/v1/completions", "200").inc(3)
        counter.labels("/v1/completions", "429").inc()
        counter.labels("/v1/chat/completions", 200).inc()  # not a str: the same series as "200"
        counter.labels("/v1/chat/completions", "200").inc()
    for gauge in both("Gauge", "g", "a gauge"):
        gauge.inc(4)
        gauge.dec()
        gauge.set(7)
    for gauge in both("Gauge", "lg", "a labelled gauge", ["worker"]):
        gauge.labels("a").inc()
        gauge.labels("b").set(2)
        gauge.labels("c").set(3)
        gauge.remove("c")  # a worker that left
    for histogram in both("Histogram", "h", "a histogram", buckets=ITL_BUCKETS):
        # On a bound, between bounds, under the first and over the last.
        for value in (0.0005, 0.001, 0.0011, 0.02, 0.05, 1.0, 3.0):
            histogram.observe(value)
    for histogram in both("Histogram", "lh", "a labelled histogram", ["worker"],
                          buckets=(0.1, 1.0)):
        histogram.labels("a").observe(0.1)
        histogram.labels("b").observe(5.0)

    assert _exposition(ours) == _exposition(reference)
    # a labelled family without a series yet shows as prometheus_client's does: no samples
    both("Counter", "unused", "nothing counted yet", ["reason"])
    assert _exposition(ours) == _exposition(reference)


def test_a_read_gauge_reads_as_prometheus_client_gauge_would() -> None:
    """Each reader's series, at scrape time; one given by two readers is their sum."""
    ours, reference = CollectorRegistry(), CollectorRegistry()
    read = loop_metrics.ReadGauge("rg", "a read gauge", ["worker"], registry=ours)
    counts = {"a": 2, "b": 0}
    read.add_reader(lambda: [((w,), n) for w, n in counts.items()])
    read.add_reader(lambda: [(("b",), 1), (("c",), 3.5)])
    counts["a"] = 5  # read when scraped, not when added
    gauge = prometheus_client.Gauge("rg", "a read gauge", ["worker"], registry=reference)
    for worker, value in (("a", 5), ("b", 1), ("c", 3.5)):
        gauge.labels(worker).set(value)
    assert _exposition(ours) == _exposition(reference)


def test_a_loop_metric_refuses_what_prometheus_client_refuses() -> None:
    registry = CollectorRegistry()
    counter = loop_metrics.Counter("c", "a counter", ["reason"], registry=registry)
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("x").inc(-1)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("x", "y")
    with pytest.raises(ValueError, match="Duplicated"):  # one name per registry
        loop_metrics.Gauge("c", "again", registry=registry)


def test_processes_merge_into_one_page_with_each_sample_labelled_by_its_process() -> None:
    first, second = RouterMetrics(), RouterMetrics()
    first.requests.labels("/v1/completions", "200").inc(3)
    second.requests.labels("/v1/completions", "200").inc(5)
    second.requests.labels("/v1/completions", "429").inc()
    first.ttft.observe(0.02)
    second.itl.observe(0.004)
    page = merge_processes({1: second.render().decode(), 0: first.render().decode()})
    families = list(text_string_to_metric_families(page.decode()))
    names = [f.name for f in families]
    assert len(names) == len(set(names))  # each family once, as Prometheus requires
    requests = {(s.labels["process"], s.labels["status"]): s.value
                for f in families if f.name == RouterMetric.REQUESTS
                for s in f.samples if s.name.endswith("_total")}
    assert requests == {("0", "200"): 3.0, ("1", "200"): 5.0, ("1", "429"): 1.0}
    counts = {s.labels["process"]: s.value for f in families
              if f.name == RouterMetric.INTER_TOKEN_LATENCY_SECONDS
              for s in f.samples if s.name.endswith("_count")}
    assert counts == {"0": 0.0, "1": 1.0}  # the hand-written histogram merges too
    # every sample says whose it is
    assert all("process" in s.labels for f in families for s in f.samples)


async def test_a_sibling_that_does_not_answer_is_left_out(tmp_path) -> None:
    assert await read_sibling_metrics(str(tmp_path / "9.sock"), timeout=1.0) is None
