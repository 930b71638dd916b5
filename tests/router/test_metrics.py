"""The router exports every metric family the contract names for other parts to read."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from frota.api.contract import RouterMetric
from frota.router.disagg import DisaggMetrics
from frota.router.metrics import RouterMetrics


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
