"""The router exports every metric family the contract names for other parts to read."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frota.api.contract import RouterMetric
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


def test_inter_token_latency_reads_as_a_prometheus_client_histogram_would() -> None:
    metrics = RouterMetrics()
    reference = CollectorRegistry()
    histogram = Histogram(RouterMetric.INTER_TOKEN_LATENCY_SECONDS, "the same",
                          buckets=ITL_BUCKETS, registry=reference)
    # On a bound, between bounds, under the first and over the last.
    for gap in (0.0005, 0.001, 0.0011, 0.02, 0.05, 1.0, 3.0):
        metrics.itl.observe(gap)
        histogram.observe(gap)

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        family = next(f for f in text_string_to_metric_families(generate_latest(registry).decode())
                      if f.name == RouterMetric.INTER_TOKEN_LATENCY_SECONDS)
        assert family.type == "histogram"
        return {(s.name, s.labels.get("le", "")): s.value for s in family.samples
                if not s.name.endswith("_created")}

    assert samples(metrics.registry) == samples(reference)
    assert metrics.registry.get_sample_value(
        RouterMetric.INTER_TOKEN_LATENCY_SECONDS + "_created") is not None


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
