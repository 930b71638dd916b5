"""The router exports every metric family the contract names for other parts to read."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frota.api.contract import RouterMetric
from frota.router.disagg import DisaggMetrics
from frota.router.metrics import ITL_BUCKETS, RouterMetrics


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
