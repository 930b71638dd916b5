"""Transient and permanent API errors, and the autoscaling timer, against kmock."""

from __future__ import annotations

import pytest
from frota.operator import apply

from tests.operator_reconcile.conftest import Cluster, FakeApiserver, Operator, sample, wait_for
from tests.operator_reconcile.test_handlers import converge, owned, status_is


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply, "RETRY_DELAY_SECONDS", 0.2)


async def test_transient_api_errors_are_retried_until_the_fleet_converges(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    apiserver.fail("PATCH", "/statefulsets/", status=409, times=3)
    await cluster.create_isvc(sample("tiny", replicas=1))
    await wait_for(lambda: owned(cluster, "tiny")["StatefulSet"], what="the group despite errors")
    await converge(cluster, "tiny", 1)
    assert operator.fleet.metrics.reconciles.labels("retry")._value.get() >= 1


async def test_permanent_api_errors_are_reported_not_retried(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    apiserver.fail("PATCH", "/statefulsets/", status=422, times=1000)
    await cluster.create_isvc(sample("tiny", replicas=1))
    events = await wait_for(lambda: cluster.events("ReconcileFailed"), what="a failure event")
    assert "422" in events[0]["message"] and "not retrying" in events[0]["message"]
    assert operator.fleet.metrics.reconciles.labels("error")._value.get() >= 1


async def test_autoscaler_scales_up_on_queue_depth_and_says_so(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    text = ("# TYPE frota_router_queue_depth gauge\nfrota_router_queue_depth 8\n")
    apiserver["get /router-metrics"] << text.encode()
    operator.fleet.metrics_url = lambda body: f"{str(apiserver.url).rstrip('/')}/router-metrics"
    await cluster.create_isvc(sample("tiny", replicas=1, autoscaling={
        "minReplicas": 1, "maxReplicas": 3, "metric": "queueDepth", "target": 2,
        "stabilizationWindowSeconds": 0}))
    await wait_for(lambda: cluster.isvc("tiny")["spec"]["replicas"] == 3, what="scaled to max")
    await wait_for(lambda: len(owned(cluster, "tiny")["StatefulSet"]) == 3, what="3 groups")
    events = await wait_for(lambda: cluster.events("ScaledUp"), what="a ScaledUp event")
    assert "1 -> 3" in events[0]["message"], [e["message"] for e in events]
    assert len(events) == 1, [e["message"] for e in events]
    assert operator.fleet.metrics.scale_decisions.labels("up")._value.get() == 1
    await wait_for(status_is(cluster, "tiny", "SpecValid", "True"), what="status")
