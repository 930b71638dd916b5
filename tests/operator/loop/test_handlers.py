"""The operator's handlers against an emulated Kubernetes API (kmock)."""

from __future__ import annotations

from frota.operator.loop.handlers import STOP_GRACE_SECONDS
from tests.operator.conftest import (
    Cluster,
    FakeApiserver,
    Operator,
    sample,
    wait_for,
)

CHILD_KINDS = ("StatefulSet", "Service", "Deployment", "ConfigMap", "ServiceAccount", "Role",
               "RoleBinding", "PodDisruptionBudget", "NetworkPolicy")
REVISION = "frota.dev/revision"
SECRETS = "/api/v1/namespaces/default/secrets"


def owned(cluster: Cluster, name: str) -> dict[str, dict[str, dict]]:
    """Every child of one InferenceService: kind -> name -> object."""
    return {
        kind: {o["metadata"]["name"]: o for o in cluster.objects(kind)
               if o["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == name}
        for kind in CHILD_KINDS
    }


def status_is(cluster: Cluster, name: str, type_: str, status: str,
              reason: str | tuple[str, ...] | None = None):
    reasons = (reason,) if isinstance(reason, str) else reason

    def check() -> bool:
        cond = cluster.condition(name, type_)
        return bool(cond and cond["status"] == status
                    and (reasons is None or cond["reason"] in reasons))
    return check


def group_revisions(cluster: Cluster, name: str) -> dict[str, str]:
    return {n: o["metadata"]["labels"][REVISION] for n, o in owned(cluster, name)["StatefulSet"].items()}


def pods_of(cluster: Cluster, group: str) -> list[dict]:
    return [p for p in cluster.objects("Pod") if p["metadata"]["name"].startswith(group + "-")]


async def stamp_demand(cluster: Cluster, name: str, when: str) -> None:
    """What the router of a fleet at zero does when it holds a request: stamp the fleet's
    demand ConfigMap, the one object its Role lets it write."""
    demand = f"{name}-demand"
    await wait_for(lambda: cluster.get("ConfigMap", demand), what="the demand ConfigMap")
    await cluster.call("PATCH", cluster.path("ConfigMap", demand), {"data": {"demandedAt": when}})


async def groups_created(cluster: Cluster, name: str, groups: int) -> None:
    """Wait until `name` has `groups` StatefulSets."""
    await wait_for(lambda: len(owned(cluster, name)["StatefulSet"]) == groups,
                   what=f"StatefulSets: {groups}")


async def create_with_router(cluster: Cluster, name: str, replicas: int) -> None:
    """Create `name` with `replicas` groups; once they exist, run its router (no pods yet)."""
    await cluster.create_isvc(sample(name, replicas=replicas))
    await groups_created(cluster, name, replicas)
    await cluster.run_router(f"{name}-router")


async def converge(cluster: Cluster, name: str, groups: int) -> None:
    """Let every group and the router run, and wait for Ready=True."""
    await groups_created(cluster, name, groups)
    await cluster.run_everything(name)
    await wait_for(status_is(cluster, name, "Ready", "True"), what="Ready=True")


async def test_create_renders_every_child_with_owner_references(
    cluster: Cluster, operator: Operator
) -> None:
    created = await cluster.create_isvc(sample("tiny", replicas=2))
    uid = created["metadata"]["uid"]
    await wait_for(status_is(cluster, "tiny", "SpecValid", "True"), what="status")
    children = owned(cluster, "tiny")
    assert set(children["StatefulSet"]) == {"tiny-worker-0", "tiny-worker-1"}
    for kind in CHILD_KINDS:
        assert children[kind], kind
        for obj in children[kind].values():
            refs = obj["metadata"]["ownerReferences"]
            assert [(r["uid"], r["controller"]) for r in refs] == [(uid, True)]
    status = cluster.isvc("tiny")["status"]
    assert status["observedGeneration"] == 1
    assert status["url"].startswith("http://tiny.default.svc")
    assert "app.kubernetes.io/instance=tiny" in status["selector"]
    assert status["mode"] == "Colocated"
    assert cluster.condition("tiny", "Ready")["status"] == "False"
    assert cluster.condition("tiny", "Progressing")["status"] == "True"


async def test_status_tells_the_truth_while_a_group_is_not_ready(
    cluster: Cluster, operator: Operator
) -> None:
    await create_with_router(cluster, "tiny", 2)
    await cluster.run_pods("tiny-worker-0", ready=True)
    await cluster.run_pods("tiny-worker-1", ready=False)

    def one_of_two() -> bool:
        status = cluster.isvc("tiny").get("status") or {}
        return status.get("roles") == [
            {"role": "worker", "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}
        ]

    await wait_for(one_of_two, what="1 of 2 ready")
    ready = cluster.condition("tiny", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasNotReady")
    assert cluster.isvc("tiny")["status"]["readyReplicas"] == 1

    await cluster.set_pod("tiny-worker-1-0", ready=True)
    await wait_for(status_is(cluster, "tiny", "Ready", "True", "AllReplicasReady"), what="Ready")
    assert cluster.isvc("tiny")["status"]["readyReplicas"] == 2
    assert status_is(cluster, "tiny", "Progressing", "False")()
    assert status_is(cluster, "tiny", "Degraded", "False")()
    await wait_for(lambda: cluster.events("ReadyTrue"), what="a ReadyTrue event")


async def test_an_image_that_cannot_be_pulled_is_named_in_status_until_it_can(
    cluster: Cluster, operator: Operator
) -> None:
    await create_with_router(cluster, "tiny", 1)
    await cluster.run_pods("tiny-worker-0", ready=False)
    await cluster.set_pod("tiny-worker-0-0", ready=False, phase="Pending", waiting="ImagePullBackOff")
    await wait_for(status_is(cluster, "tiny", "Progressing", "False", "ImagePullFailed"),
                   what="Progressing=False ImagePullFailed")
    message = cluster.condition("tiny", "Progressing")["message"]
    image = cluster.get("Pod", "tiny-worker-0-0")["spec"]["containers"][0]["image"]
    assert "tiny-worker-0-0" in message and image in message, message
    assert cluster.condition("tiny", "Ready")["reason"] == "ImagePullFailed"

    await cluster.set_pod("tiny-worker-0-0", ready=True)
    await wait_for(status_is(cluster, "tiny", "Ready", "True", "AllReplicasReady"), what="Ready")
    assert status_is(cluster, "tiny", "Progressing", "False", "Complete")()


async def test_update_rolls_group_by_group_and_never_mixes_revisions(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_isvc(sample("tiny", replicas=3, rollout={"maxUnavailable": 1,
                                                                  "maxSurge": 0}))
    await converge(cluster, "tiny", 3)
    old = set(group_revisions(cluster, "tiny").values())
    assert len(old) == 1

    await cluster.patch_isvc("tiny", {"spec": {"engine": {"maxModelLen": 1024}}})
    replaced_order = []
    for _ in range(3):
        # Exactly one more group moves to the new revision, and only once the
        # previous one serves again: never more than maxUnavailable=1 down.
        def next_group_replaced() -> str | None:
            revs = group_revisions(cluster, "tiny")
            new = [n for n, r in revs.items() if r not in old]
            return new[-1] if len(new) == len(replaced_order) + 1 else None

        await wait_for(next_group_replaced, what="the next group")
        revs = group_revisions(cluster, "tiny")
        new = sorted(n for n, r in revs.items() if r not in old)
        assert len(new) == len(replaced_order) + 1, revs
        group = next(n for n in new if n not in replaced_order)
        replaced_order.append(group)
        # The group's old pods went together: none of its ranks runs the old revision.
        await wait_for(lambda g=group: not pods_of(cluster, g), what="old pods of the group gone")
        # Still progressing while the replaced group is down: RollingUpdate while older
        # groups remain, Scaling once every group is on the new revision but this one is
        # not serving yet (the status moves between them as fast as pods are recreated).
        await wait_for(status_is(cluster, "tiny", "Progressing", "True",
                                 ("RollingUpdate", "Scaling")),
                       what="Progressing while the group is down")
        assert cluster.isvc("tiny")["status"]["roles"][0]["readyReplicas"] >= 2
        await cluster.run_pods(group)
    assert replaced_order == ["tiny-worker-0", "tiny-worker-1", "tiny-worker-2"]
    await wait_for(status_is(cluster, "tiny", "Ready", "True"), what="Ready after the rollout")
    assert cluster.isvc("tiny")["status"]["observedGeneration"] == 2
    assert cluster.events("GroupUpdating")


async def test_rollout_with_surge_keeps_every_replica_serving(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_isvc(sample("tiny", replicas=2))  # maxUnavailable 0, maxSurge 1
    await converge(cluster, "tiny", 2)
    await cluster.patch_isvc("tiny", {"spec": {"engine": {"maxModelLen": 1024}}})
    await wait_for(lambda: "tiny-worker-2" in owned(cluster, "tiny")["StatefulSet"],
                   what="a surge group")
    old = group_revisions(cluster, "tiny")["tiny-worker-0"]
    assert group_revisions(cluster, "tiny")["tiny-worker-1"] == old  # nothing taken down yet
    await cluster.run_pods("tiny-worker-2")
    for group in ("tiny-worker-0", "tiny-worker-1"):
        await wait_for(lambda g=group: group_revisions(cluster, "tiny")[g] != old, what=group)
        await wait_for(lambda g=group: not pods_of(cluster, g), what="old pods of the group gone")
        assert len([g for g, r in group_revisions(cluster, "tiny").items()
                    if r != old and g != "tiny-worker-2"]) == 1 + (group == "tiny-worker-1")
        await cluster.run_pods(group)
    await wait_for(lambda: "tiny-worker-2" not in owned(cluster, "tiny")["StatefulSet"],
                   what="the surge group removed")
    await wait_for(status_is(cluster, "tiny", "Ready", "True"), what="Ready")


async def test_scale_subresource_adds_and_removes_whole_groups(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_isvc(sample("tiny", replicas=1))
    await converge(cluster, "tiny", 1)

    await cluster.patch_isvc("tiny", {"spec": {"replicas": 3}}, subresource="scale")
    await wait_for(lambda: set(owned(cluster, "tiny")["StatefulSet"])
                   == {"tiny-worker-0", "tiny-worker-1", "tiny-worker-2"}, what="3 groups")
    assert {n for n in owned(cluster, "tiny")["Service"] if n.startswith("tiny-worker-")} == {
        "tiny-worker-0", "tiny-worker-1", "tiny-worker-2"}
    await wait_for(status_is(cluster, "tiny", "Progressing", "True", "Scaling"), what="scaling")
    await cluster.run_everything("tiny")
    await wait_for(lambda: cluster.isvc("tiny")["status"]["readyReplicas"] == 3, what="3 ready")

    await cluster.patch_isvc("tiny", {"spec": {"replicas": 0}}, subresource="scale")
    await wait_for(lambda: not owned(cluster, "tiny")["StatefulSet"], what="no groups")
    assert "tiny-worker-0" not in owned(cluster, "tiny")["Service"]
    assert "tiny-router" in owned(cluster, "tiny")["Deployment"]
    await wait_for(status_is(cluster, "tiny", "Ready", "False", "ScaledToZero"), what="zero")
    assert cluster.isvc("tiny")["status"]["replicas"] == 0


async def test_at_zero_a_demand_announced_by_the_router_brings_a_replica_back_at_once(
    cluster: Cluster, operator: Operator
) -> None:
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "target": 4}
    await cluster.create_isvc(sample("tiny", replicas=0, autoscaling=autoscaling))
    await wait_for(lambda: "tiny-router" in owned(cluster, "tiny")["Deployment"], what="router")
    await cluster.run_router("tiny-router")
    # Idle at zero is a serving state: the router holds requests while a replica starts.
    await wait_for(status_is(cluster, "tiny", "Ready", "True", "ScaledToZero"), what="zero")
    assert not owned(cluster, "tiny")["StatefulSet"]
    # No router metrics here, so the autoscaling timer has nothing to go on: only the
    # demand handler can answer the router's stamp.
    await stamp_demand(cluster, "tiny", "2026-12-03T12:00:00Z")
    await wait_for(lambda: cluster.isvc("tiny")["spec"]["replicas"] == 1, what="one replica")
    await groups_created(cluster, "tiny", 1)
    events = [e for e in cluster.objects("Event") if e.get("reason") == "ScaledUp"]
    assert any("holds a request" in e.get("message", "") for e in events), events


async def test_a_disaggregated_fleet_takes_both_roles_to_zero_and_brings_both_back_on_demand(
    cluster: Cluster, operator: Operator
) -> None:
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "target": 4, "scaleToZero": {}}
    await cluster.create_isvc(sample("pd", replicas=1, autoscaling=autoscaling, disaggregation={
        "prefill": {"replicas": 1}, "decode": {"replicas": 2}}))
    await groups_created(cluster, "pd", 3)
    await cluster.run_router("pd-router")
    applied = {k: v for k, v in cluster.isvc("pd")["spec"].items() if k != "replicas"}
    # what the autoscaler does once the router has been idle for idleSeconds
    await cluster.patch_isvc("pd", {"spec": {"replicas": 0}}, subresource="scale")
    await wait_for(lambda: not owned(cluster, "pd")["StatefulSet"], what="no group of either role")
    assert "pd-router" in owned(cluster, "pd")["Deployment"]
    await wait_for(status_is(cluster, "pd", "Ready", "True", "ScaledToZero"), what="zero")

    await stamp_demand(cluster, "pd", "2026-12-04T12:00:00Z")
    await groups_created(cluster, "pd", 3)  # a whole unit: its prefill and both decode groups
    assert set(owned(cluster, "pd")["StatefulSet"]) == {"pd-prefill-0", "pd-decode-0", "pd-decode-1"}
    assert cluster.isvc("pd")["spec"]["replicas"] == 1
    # GitOps: zero and back changed no field but the replicas the autoscaler owns
    assert {k: v for k, v in cluster.isvc("pd")["spec"].items() if k != "replicas"} == applied


async def test_a_vllm_fleet_goes_to_zero_and_comes_back_on_demand_as_a_frota_one_does(
    cluster: Cluster, operator: Operator
) -> None:
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "target": 4, "scaleToZero": {}}
    await cluster.create_isvc(sample("vl", replicas=1, autoscaling=autoscaling,
                                     runtime={"engine": "vllm"}, resources={"cpu": "2", "memory": "5Gi"},
                                     engine={"dtype": "float32", "maxModelLen": 2048,
                                             "kvCache": {"blockSize": 32}}))
    await groups_created(cluster, "vl", 1)
    await cluster.run_router("vl-router")
    await cluster.patch_isvc("vl", {"spec": {"replicas": 0}}, subresource="scale")
    await wait_for(lambda: not owned(cluster, "vl")["StatefulSet"], what="no groups")
    await wait_for(status_is(cluster, "vl", "Ready", "True", "ScaledToZero"), what="zero")
    await stamp_demand(cluster, "vl", "2026-12-04T12:00:00Z")
    await groups_created(cluster, "vl", 1)
    (group,) = owned(cluster, "vl")["StatefulSet"].values()
    container = group["spec"]["template"]["spec"]["containers"][0]
    assert "vllm" in " ".join(container.get("command", []) + container.get("args", []))


async def test_the_fleet_key_is_made_once_kept_through_a_rotation_and_made_again_if_deleted(
    cluster: Cluster, operator: Operator
) -> None:
    created = await cluster.create_isvc(sample("tiny", replicas=1))
    await wait_for(lambda: cluster.get("Secret", "tiny-fleet-key"), what="the fleet key")
    secret = cluster.get("Secret", "tiny-fleet-key")
    assert [r["uid"] for r in secret["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]
    key = secret["stringData"]["key"]
    assert len(key) == 64 and int(key, 16) >= 0
    # Mounted by name into the router and the workers.
    for kind, name in (("Deployment", "tiny-router"), ("StatefulSet", "tiny-worker-0")):
        await wait_for(lambda k=kind, n=name: cluster.get(k, n), what=name)
        volumes = cluster.get(kind, name)["spec"]["template"]["spec"]["volumes"]
        assert {"secretName": "tiny-fleet-key"}.items() <= next(
            v["secret"] for v in volumes if v["name"] == "fleet-key").items()
    # A rotation is the user's write: the timer (every 0.5 s here) leaves it alone.
    await cluster.call("PATCH", cluster.path("Secret", "tiny-fleet-key"),
                       {"stringData": {"key": "b" * 64}})
    posts = len([w for w in cluster.server.writes if w == ("POST", SECRETS)])
    await wait_for(lambda: len([w for w in cluster.server.writes if w == ("POST", SECRETS)])
                   >= posts + 2, what="two more checks")
    assert cluster.get("Secret", "tiny-fleet-key")["stringData"] == {"key": "b" * 64}
    # Deleted: made again, with a new key.
    await cluster.delete("Secret", "tiny-fleet-key")
    await wait_for(lambda: cluster.get("Secret", "tiny-fleet-key"), what="a new fleet key")
    assert cluster.get("Secret", "tiny-fleet-key")["stringData"]["key"] not in (key, "b" * 64)


async def test_delete_lets_the_garbage_collector_take_every_child(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_isvc(sample("tiny", replicas=1))
    await converge(cluster, "tiny", 1)
    await cluster.delete("InferenceService", "tiny")
    await wait_for(lambda: not any(owned(cluster, "tiny").values()), what="children gone")
    await wait_for(lambda: not cluster.objects("Pod"), what="pods gone")
    writes = len(cluster.server.writes)
    # Nothing comes back once the owner is gone.
    await cluster.create_isvc(sample("other", replicas=1))
    await wait_for(lambda: owned(cluster, "other")["StatefulSet"], what="another isvc works")
    assert not any(owned(cluster, "tiny").values())
    assert writes < len(cluster.server.writes)


async def test_deleted_or_edited_children_come_back(cluster: Cluster, operator: Operator) -> None:
    await cluster.create_isvc(sample("tiny", replicas=1))
    await converge(cluster, "tiny", 1)
    before = owned(cluster, "tiny")

    await cluster.delete("StatefulSet", "tiny-worker-0")
    await wait_for(lambda: "tiny-worker-0" in owned(cluster, "tiny")["StatefulSet"],
                   what="the StatefulSet back")
    await cluster.call("PATCH", cluster.path("Service", "tiny"), {"spec": {"ports": []}})
    await wait_for(lambda: owned(cluster, "tiny")["Service"]["tiny"]["spec"]["ports"]
                   == before["Service"]["tiny"]["spec"]["ports"], what="the ports back")
    await cluster.delete("ConfigMap", "tiny-engine")
    await wait_for(lambda: "tiny-engine" in owned(cluster, "tiny")["ConfigMap"], what="config")


async def test_restart_converges_without_duplicates_or_writes(
    cluster: Cluster, apiserver: FakeApiserver
) -> None:
    async with Operator(apiserver):
        await cluster.create_isvc(sample("tiny", replicas=2))
        await converge(cluster, "tiny", 2)
    snapshot = {kind: {n: o["metadata"]["uid"] for n, o in objs.items()}
                for kind, objs in owned(cluster, "tiny").items()}
    key_uid = cluster.get("Secret", "tiny-fleet-key")["metadata"]["uid"]
    writes_before = len(apiserver.writes)

    async with Operator(apiserver) as second:
        await wait_for(
            lambda: second.metric("frota_operator_reconciles_total", result="converged") >= 1,
            what="a reconcile by the new operator")
        # A second pass (pokes from the initial listing of children) changes nothing either.
        await wait_for(lambda: second.state.pending == 0, what="no reconcile pending")
    after = {kind: {n: o["metadata"]["uid"] for n, o in objs.items()}
             for kind, objs in owned(cluster, "tiny").items()}
    assert after == snapshot
    # The fleet key is made sure of once per operator process: a POST answered 409.
    probes = [w for w in apiserver.writes[writes_before:] if w == ("POST", SECRETS)]
    assert len(probes) == 1
    assert cluster.get("Secret", "tiny-fleet-key")["metadata"]["uid"] == key_uid  # not replaced
    child_writes = [w for w in apiserver.writes[writes_before:]
                    if "/inferenceservices/" not in w[1] and "/events" not in w[1]
                    and w != ("POST", SECRETS)]
    assert child_writes == []


async def test_invalid_spec_creates_nothing_and_names_the_field(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_isvc(sample("bad", engine={"dtype": "float32", "maxModelLen": 999999}))
    await wait_for(status_is(cluster, "bad", "SpecValid", "False", "InvalidSpec"), what="invalid")
    assert "engine.maxModelLen" in cluster.condition("bad", "SpecValid")["message"]
    assert not any(owned(cluster, "bad").values())
    await wait_for(lambda: cluster.events("SpecValidFalse"), what="a warning event")


async def test_invalid_update_leaves_healthy_children_untouched(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_isvc(sample("tiny", replicas=1))
    await converge(cluster, "tiny", 1)
    versions = {n: o["metadata"]["resourceVersion"]
                for n, o in owned(cluster, "tiny")["StatefulSet"].items()}
    await cluster.patch_isvc("tiny", {"spec": {"engine": {"maxModelLen": 999999}}})
    await wait_for(status_is(cluster, "tiny", "SpecValid", "False"), what="invalid")
    assert cluster.condition("tiny", "SpecValid")["observedGeneration"] == 2
    assert {n: o["metadata"]["resourceVersion"]
            for n, o in owned(cluster, "tiny")["StatefulSet"].items()} == versions
    assert not [p for p in cluster.objects("Pod") if p["metadata"].get("deletionTimestamp")]
    assert len(cluster.objects("Pod")) == 1

    await cluster.patch_isvc("tiny", {"spec": {"engine": {"maxModelLen": 2048}}})
    await wait_for(status_is(cluster, "tiny", "SpecValid", "True"), what="valid again")


async def test_a_dead_rank_restarts_its_whole_group(cluster: Cluster, operator: Operator) -> None:
    await cluster.create_isvc(sample("tiny", replicas=1, parallelism={"pipeline": 2}))
    await converge(cluster, "tiny", 1)
    assert {p["metadata"]["name"] for p in cluster.objects("Pod")} == {
        "tiny-worker-0-0", "tiny-worker-0-1"}

    await cluster.set_pod("tiny-worker-0-1", ready=False, restarts=1)
    await wait_for(lambda: not cluster.objects("Pod"), what="both ranks deleted together")
    await wait_for(lambda: cluster.events("GroupRestarted"), what="a GroupRestarted event")
    await wait_for(status_is(cluster, "tiny", "Ready", "False"), what="not ready meanwhile")
    await cluster.run_pods("tiny-worker-0")
    await wait_for(status_is(cluster, "tiny", "Ready", "True"), what="ready again")


async def test_disaggregated_units_count_prefill_and_decode_groups(
    cluster: Cluster, operator: Operator
) -> None:
    await cluster.create_disaggregated(replicas=2, prefill=1, decode=2)
    await groups_created(cluster, "pd", 6)
    assert set(owned(cluster, "pd")["StatefulSet"]) == {
        "pd-prefill-0", "pd-prefill-1", "pd-decode-0", "pd-decode-1", "pd-decode-2",
        "pd-decode-3"}
    await cluster.run_router("pd-router")
    for group in ("pd-prefill-0", "pd-decode-0", "pd-decode-1", "pd-decode-2"):
        await cluster.run_pods(group)

    def one_unit_ready() -> bool:
        status = cluster.isvc("pd").get("status") or {}
        return status.get("readyReplicas") == 1 and status.get("replicas") == 2

    await wait_for(one_unit_ready, what="one whole unit ready")  # prefill-1 missing
    assert cluster.isvc("pd")["status"]["mode"] == "Disaggregated"
    assert cluster.condition("pd", "Ready")["status"] == "False"
    await cluster.run_pods("pd-prefill-1")
    await cluster.run_pods("pd-decode-3")
    await wait_for(status_is(cluster, "pd", "Ready", "True"), what="Ready")

    # A decode-only change rolls decode groups and leaves prefill groups alone.
    before = group_revisions(cluster, "pd")
    await cluster.patch_isvc("pd", {"spec": {"disaggregation": {
        "decode": {"replicas": 2, "resources": {"cpu": "3", "memory": "3Gi"}}}}})
    await wait_for(lambda: group_revisions(cluster, "pd")["pd-decode-4"]
                   != before["pd-decode-0"], what="a decode surge group")
    after = group_revisions(cluster, "pd")
    assert all(after[g] == before[g] for g in ("pd-prefill-0", "pd-prefill-1"))


async def test_children_are_not_recreated_while_the_owner_is_being_deleted(
    cluster: Cluster, operator: Operator
) -> None:
    manifest = sample("tiny", replicas=1)
    manifest["metadata"]["finalizers"] = ["example.com/hold"]  # like foreground deletion
    await cluster.create_isvc(manifest)
    await converge(cluster, "tiny", 1)
    assert "frota.dev/operator" in cluster.isvc("tiny")["metadata"]["finalizers"]
    await cluster.delete("InferenceService", "tiny")
    # kopf lets go of the object (drops its finalizer) once the reconcile loop and the timers
    # have stopped: at worst after the loop's cancellation backoff and timeout.
    await wait_for(lambda: cluster.isvc("tiny")["metadata"]["finalizers"] == ["example.com/hold"],
                   timeout=2 * STOP_GRACE_SECONDS + 5, what="the operator letting go")
    await cluster.delete("StatefulSet", "tiny-worker-0")
    key = ("default", "tiny")
    await wait_for(lambda: not operator.state.children(key).of_kind("StatefulSet"),
                   what="the operator seeing the deletion")
    # A poke that finds no loop is dropped; another InferenceService still converges.
    await cluster.create_isvc(sample("other", replicas=1))
    await wait_for(lambda: owned(cluster, "other")["StatefulSet"], what="another isvc works")
    assert "tiny-worker-0" not in owned(cluster, "tiny")["StatefulSet"]


async def test_ready_waits_until_the_router_can_discover_the_groups(
    cluster: Cluster, operator: Operator
) -> None:
    cluster.endpoints_lag = True
    await cluster.create_isvc(sample("tiny", replicas=1))
    await wait_for(lambda: owned(cluster, "tiny")["StatefulSet"], what="the group")
    await cluster.run_everything("tiny")
    await wait_for(status_is(cluster, "tiny", "Ready", "False", "EndpointsPending"),
                   what="EndpointsPending")
    assert "tiny-worker-0" in cluster.condition("tiny", "Ready")["message"]
    await cluster.sync_endpoints()
    await wait_for(status_is(cluster, "tiny", "Ready", "True"), what="Ready once discoverable")
