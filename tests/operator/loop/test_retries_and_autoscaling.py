"""Transient and permanent API errors, and the autoscaling timer, against kmock."""

from __future__ import annotations

from frota.operator.scaling import decisions
from tests.operator.conftest import Cluster, FakeApiserver, Operator, sample, wait_for
from tests.operator.loop.test_handlers import converge, groups_created, owned, status_is

RECONCILES = "frota_operator_reconciles_total"
DECISIONS = "frota_operator_autoscale_decisions_total"
DESIRED = "frota_operator_autoscale_desired_replicas"


async def test_transient_api_errors_are_retried_until_the_fleet_converges(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    apiserver.fail("PATCH", "/statefulsets/", status=409, times=3)
    await cluster.create_isvc(sample("tiny", replicas=1))
    await wait_for(lambda: owned(cluster, "tiny")["StatefulSet"], what="the group despite errors")
    await converge(cluster, "tiny", 1)
    assert operator.metric(RECONCILES, result="retry") >= 1


async def test_permanent_api_errors_are_reported_not_retried(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    apiserver.fail("PATCH", "/statefulsets/", status=422, times=1000)
    await cluster.create_isvc(sample("tiny", replicas=1))
    events = await wait_for(lambda: cluster.events("ReconcileFailed"), what="a failure event")
    assert "422" in events[0]["message"] and "not retrying" in events[0]["message"]
    assert operator.metric(RECONCILES, result="error") >= 1


async def test_autoscaler_scales_up_on_queue_depth_and_says_so(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    text = ("# TYPE frota_router_queue_depth gauge\nfrota_router_queue_depth 8\n")
    apiserver["get /router-metrics"] << text.encode()
    operator.state.metrics_url = lambda isvc: f"{str(apiserver.url).rstrip('/')}/router-metrics"
    await cluster.create_isvc(sample("tiny", replicas=1, autoscaling={
        "minReplicas": 1, "maxReplicas": 3, "metric": "queueDepth", "target": 2,
        "stabilizationWindowSeconds": 0}))
    await wait_for(lambda: cluster.isvc("tiny")["spec"]["replicas"] == 3, what="scaled to max")
    await groups_created(cluster, "tiny", 3)
    events = await wait_for(lambda: cluster.events("ScaledUp"), what="a ScaledUp event")
    assert "1 -> 3" in events[0]["message"], [e["message"] for e in events]
    assert len(events) == 1, [e["message"] for e in events]
    assert operator.metric(DECISIONS, role="", direction="up") == 1
    await wait_for(status_is(cluster, "tiny", "SpecValid", "True"), what="status")


def worker_metrics(waiting: float, running: float = 0.0) -> bytes:
    """A worker's /metrics with a queue (what a role's rank-0 pod serves)."""
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="smollm2"}} {waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="smollm2"}} {running}\n'
    ).encode()


def serve_role_metrics(apiserver: FakeApiserver, operator: Operator, **by_role: bytes) -> None:
    """Each role's workers answer on their own path of the fake server."""
    for role, text in by_role.items():
        apiserver[f"get /{role}-metrics"] << text
    base = str(apiserver.url).rstrip("/")
    operator.state.role_metrics_urls = (
        lambda pods, role: [f"{base}/{role}-metrics"] if role in by_role else [])


def role(cluster: Cluster, name: str, which: str) -> dict:
    return cluster.isvc(name)["spec"]["disaggregation"][which]


async def test_prefill_scales_up_on_its_own_queue_while_decode_stays(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    # prefill: 8 waiting per group, target 2 -> 4x, capped at maxReplicas 3;
    # decode: 2 per group against a target of 2 -> stays at 2.
    serve_role_metrics(apiserver, operator, prefill=worker_metrics(6, 2),
                       decode=worker_metrics(1, 1))
    await cluster.create_isvc(sample("pd", replicas=1, disaggregation={
        "prefill": {"replicas": 1, "autoscaling": {
            "minReplicas": 1, "maxReplicas": 3, "target": 2, "stabilizationWindowSeconds": 0}},
        "decode": {"replicas": 2, "autoscaling": {
            "minReplicas": 1, "maxReplicas": 4, "target": 2, "stabilizationWindowSeconds": 0}},
    }))
    await wait_for(lambda: role(cluster, "pd", "prefill")["replicas"] == 3, what="prefill at max")
    events = await wait_for(lambda: cluster.events("ScaledUp"), what="a ScaledUp event")
    assert "autoscaling prefill: 1 -> 3" in events[0]["message"], [e["message"] for e in events]
    await wait_for(
        lambda: operator.metric(DESIRED, namespace="default", name="pd", role="decode") == 2,
        what="a decode decision")
    assert role(cluster, "pd", "decode")["replicas"] == 2
    assert cluster.isvc("pd")["spec"]["replicas"] == 1
    assert operator.metric(DECISIONS, role="prefill", direction="up") == 1
    assert operator.metric(DECISIONS, role="decode", direction="up") == 0
    assert not cluster.events("ScaledDown")
    assert len(cluster.events("ScaledUp")) == 1


async def test_decode_scales_down_only_after_its_stabilization_window(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    # decode is idle: the recommendation is its minReplicas (2), but the window
    # starts with the 3 groups of the first tick and holds them for 2 s.
    serve_role_metrics(apiserver, operator, decode=worker_metrics(0))
    window = 2
    await cluster.create_isvc(sample("pd", replicas=1, disaggregation={
        "prefill": {"replicas": 1},
        "decode": {"replicas": 3, "autoscaling": {
            "minReplicas": 2, "maxReplicas": 4, "target": 4,
            "stabilizationWindowSeconds": window}},
    }))
    seed = await wait_for(
        lambda: operator.state.scalers[("default", "pd", "decode")].recommendations[0],
        what="a first decode tick")
    assert seed[1] == 3
    events = await wait_for(lambda: cluster.events("ScaledDown"), what="a ScaledDown event")
    assert "autoscaling decode: 3 -> 2" in events[0]["message"], [e["message"] for e in events]
    assert ("default", "pd", "prefill") not in operator.state.scalers
    scaled_at, scaled_to = operator.state.scalers[("default", "pd", "decode")].last_scaled
    assert scaled_to == 2 and scaled_at - seed[0] > window  # not before the window passed
    await wait_for(lambda: role(cluster, "pd", "decode")["replicas"] == 2, what="decode at min")
    assert role(cluster, "pd", "prefill")["replicas"] == 1
    assert operator.metric(DECISIONS, role="decode", direction="down") == 1


async def test_a_roles_metrics_are_found_on_its_ready_rank0_pods(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_disaggregated()
    await groups_created(cluster, "pd", 2)
    await cluster.run_everything("pd")
    for pod in cluster.objects("Pod"):
        ip = "10.0.0.1" if pod["metadata"]["labels"]["frota.dev/role"] == "prefill" else "10.0.0.2"
        await cluster.call("PATCH", cluster.path("Pod", pod["metadata"]["name"]) + "/status",
                           {"status": {"podIP": ip}})

    def urls(role: str) -> list[str]:
        pods = operator.state.children(("default", "pd")).pods
        return decisions.role_metrics_urls(pods, role)

    await wait_for(lambda: urls("prefill") == ["http://10.0.0.1:8000/metrics"], what="prefill")
    assert urls("decode") == ["http://10.0.0.2:8000/metrics"]
