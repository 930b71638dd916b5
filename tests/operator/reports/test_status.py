"""Status from observed children: conditions, counts, transitions (pure)."""

from __future__ import annotations

import pytest

from frota.api import Condition, InferenceServiceStatus
from frota.api.contract import ConditionType, Reason
from frota.operator.reports.observe import (
    GroupView,
    ImageProblem,
    Observed,
    PodView,
    RouterView,
    observe_endpoints,
    observe_groups,
    observe_image_problems,
    pod_view,
)
from frota.operator.reports.status import (
    Intent,
    compute_conditions,
    compute_status,
    invalid_status,
    merge_conditions,
    parse_status,
    transitions,
)

REV = "r2"


def intent(units: int = 2, per_unit: dict[str, int] | None = None, unavailable: int = 0,
           revisions: dict[str, str] | None = None, scale_to_zero: bool = False) -> Intent:
    per_unit = per_unit or {"worker": 1}
    return Intent(
        generation=3, revisions=revisions or dict.fromkeys(per_unit, REV), units=units,
        groups_per_unit=per_unit, max_unavailable=dict.fromkeys(per_unit, unavailable),
        selector="app.kubernetes.io/instance=x", url="http://x.ns.svc/v1",
        serving_role="decode" if "decode" in per_unit else "worker", scale_to_zero=scale_to_zero,
    )


def pod(name: str, *, rev: str = REV, ready: bool = True, failed: bool = False,
        restarts: int = 0, terminating: bool = False) -> PodView:
    return PodView(name, rev, ready, failed, restarts, terminating)


def group(index: int, *, role: str = "worker", rev: str = REV, ranks: int = 1,
          pods: tuple[PodView, ...] | None = None) -> GroupView:
    name = f"x-{role}-{index}"
    if pods is None:
        pods = tuple(pod(f"{name}-{r}", rev=rev) for r in range(ranks))
    return GroupView(role, index, name, rev, ranks, pods)


UP = RouterView(exists=True, replicas=1, ready_replicas=1)


def conds(i: Intent, groups: tuple[GroupView, ...], router: RouterView = UP,
          old: list[Condition] | None = None) -> dict[str, Condition]:
    return {c.type: c for c in compute_conditions(i, Observed(groups, router), old)}


def cond(type_: str, status: str, reason: str = "AllReplicasReady", **extra: object) -> Condition:
    return Condition(type=type_, status=status, reason=reason, **extra)


WAS_READY = [cond("Ready", "True")]


def test_all_groups_serving_at_current_revision_is_ready() -> None:
    c = conds(intent(), (group(0), group(1)))
    assert c["Ready"].status == "True" and c["Ready"].reason == "AllReplicasReady"
    assert c["Progressing"].status == "False"
    assert c["Degraded"].status == "False"
    assert c["SpecValid"].status == "True"
    assert all(x.observedGeneration == 3 for x in c.values())


def test_a_group_with_an_unready_rank_does_not_serve() -> None:
    g = group(1, ranks=2, pods=(pod("a"), pod("b", ready=False)))
    assert not g.serving
    c = conds(intent(), (group(0), g))
    assert c["Ready"].status == "False" and c["Ready"].reason == "ReplicasNotReady"
    assert c["Progressing"].reason == "Scaling"


def test_a_group_missing_a_rank_does_not_serve() -> None:
    assert not group(0, ranks=2, pods=(pod("a"),)).serving


def test_mixed_revisions_inside_a_group_never_serve_and_force_a_restart() -> None:
    g = group(0, ranks=2, pods=(pod("a"), pod("b", rev="r1")))
    assert not g.serving and g.needs_restart


def test_old_revision_groups_are_not_ready_and_report_a_rolling_update() -> None:
    c = conds(intent(), (group(0), group(1, rev="r1")))
    assert c["Ready"].status == "False"
    assert c["Progressing"].reason == "RollingUpdate"


def test_router_down_means_not_ready_and_once_it_served_degraded() -> None:
    down = RouterView(exists=True, replicas=1)
    c = conds(intent(), (group(0), group(1)), down)
    assert c["Ready"].reason == "RouterUnavailable"
    assert c["Degraded"].status == "False"  # still starting up
    c = conds(intent(), (group(0), group(1)), down, old=WAS_READY)
    assert (c["Degraded"].status, c["Degraded"].reason) == ("True", "RouterUnavailable")


def test_scaled_to_zero_keeps_the_router_and_says_so() -> None:
    c = conds(intent(units=0), ())
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "ScaledToZero")
    assert "router" in c["Ready"].message
    assert c["Degraded"].status == "False"


def test_scaled_to_zero_by_scale_to_zero_is_ready_the_router_holds_requests() -> None:
    for per_unit in ({"worker": 1}, {"prefill": 1, "decode": 2}):
        c = conds(intent(units=0, per_unit=per_unit, scale_to_zero=True), ())
        assert (c["Ready"].status, c["Ready"].reason) == ("True", "ScaledToZero"), per_unit
        assert "holds requests" in c["Ready"].message
        assert c["Degraded"].status == "False"
    # coming back (one unit wanted, none ready yet) is not ready: the router holds meanwhile
    c = conds(intent(units=1, scale_to_zero=True), ())
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "ReplicasNotReady")


def test_a_failed_or_restarted_rank_marks_the_group_for_restart() -> None:
    assert group(0, pods=(pod("a", restarts=1),)).needs_restart
    assert group(0, pods=(pod("a", failed=True),)).needs_restart
    assert not group(0).needs_restart
    # A restart under way (pods terminating) is not restarted again.
    assert not group(0, ranks=2, pods=(pod("a", restarts=1), pod("b", terminating=True))).needs_restart
    c = conds(intent(), (group(0, pods=(pod("a", restarts=2),)), group(1)))
    assert c["Degraded"].reason == "GroupRestarting"


def test_creation_is_not_degradation_but_losing_serving_groups_is() -> None:
    c = conds(intent(), (group(0, pods=()), group(1, pods=())))
    assert c["Degraded"].status == "False"
    c = conds(intent(), (group(0), group(1, pods=())), old=WAS_READY)
    assert (c["Degraded"].status, c["Degraded"].reason) == ("True", "BelowMinAvailable")
    c = conds(intent(unavailable=1), (group(0), group(1, pods=())), old=WAS_READY)
    assert c["Degraded"].status == "False"


def test_status_counts_roles_and_whole_units() -> None:
    i = intent(units=2, per_unit={"prefill": 1, "decode": 2})
    groups = (group(0, role="prefill"), group(1, role="prefill"),
              group(0, role="decode"), group(1, role="decode"),
              group(2, role="decode", pods=()), group(3, role="decode"))
    s = compute_status(i, Observed(groups, UP), old=None, now="T")
    roles = {r.role: r for r in s.roles}
    assert roles["prefill"].to_wire() == {"role": "prefill", "replicas": 2, "readyReplicas": 2,
                                          "updatedReplicas": 2}
    assert roles["decode"].readyReplicas == 3
    assert s.replicas == 2 and s.readyReplicas == 1  # 3 of 4 decode groups: one unit
    assert s.observedGeneration == 3 and s.selector and s.url
    assert s.revision == REV
    assert all(c.lastTransitionTime == "T" for c in s.conditions)


def test_unchanged_conditions_keep_their_transition_time() -> None:
    first = merge_conditions([cond("Ready", "False", "A")], None, "T1")
    again = merge_conditions([cond("Ready", "False", "B")], first, "T2")
    flipped = merge_conditions([cond("Ready", "True", "B")], again, "T3")
    assert [c.lastTransitionTime for c in (first[0], again[0], flipped[0])] == ["T1", "T1", "T3"]


def test_only_changed_conditions_are_transitions() -> None:
    old = [cond("Ready", "False", "A"), cond("Degraded", "False", "AsExpected")]
    new = [cond("Ready", "True", "B"), cond("Degraded", "False", "AsExpected")]
    assert [c.type for c in transitions(new, old)] == ["Ready"]
    assert [c.type for c in transitions(new, None)] == ["Ready", "Degraded"]


def test_invalid_spec_names_the_field_and_keeps_the_rest() -> None:
    old = InferenceServiceStatus(replicas=2, readyReplicas=2,
                                 conditions=[cond("Ready", "True", observedGeneration=1)])
    s = invalid_status(generation=2, field_path="engine.maxModelLen", message="too long", old=old)
    c = {x.type: x for x in s.conditions}
    assert c["SpecValid"].status == "False"
    assert c["SpecValid"].message == "spec.engine.maxModelLen: too long"
    assert c["Ready"].status == "True" and c["Ready"].observedGeneration == 2
    assert c["SpecValid"].reason == Reason.INVALID_SPEC
    assert s.readyReplicas == 2 and s.observedGeneration == 2


@pytest.mark.parametrize(
    ("status", "ready", "restarts", "phase", "deleting"),
    [({"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running",
       "containerStatuses": [{"restartCount": 0}]}, True, 0, "Running", False),
     ({"phase": "Failed", "containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]},
      False, 3, "Failed", True),
     ({}, False, 0, None, False)],
)
def test_pods_are_read_from_their_status(status, ready, restarts, phase, deleting) -> None:
    meta = {"name": "p", "labels": {"frota.dev/revision": REV}}
    if deleting:
        meta["deletionTimestamp"] = "T"
    view = pod_view({"metadata": meta, "status": status})
    assert (view.ready, view.restarts, view.failed, view.terminating) == (
        ready, restarts, phase == "Failed", deleting)


def test_groups_are_joined_from_statefulsets_and_pods_by_labels() -> None:
    labels = {"frota.dev/role": "worker", "frota.dev/replica": "0", "frota.dev/revision": REV}
    sts = {"metadata": {"name": "x-worker-0", "labels": labels}, "spec": {"replicas": 2}}
    router = {"metadata": {"name": "x-router", "labels": {"frota.dev/role": "router"}}}
    pods = [{"metadata": {"name": f"x-worker-0-{r}", "labels": labels},
             "status": {"conditions": [{"type": "Ready", "status": "True"}]}} for r in range(2)]
    (g,) = observe_groups([sts, router], pods)
    assert (g.name, g.ranks, len(g.pods), g.serving) == ("x-worker-0", 2, 2, True)


def test_ready_needs_every_current_group_discoverable_by_the_router() -> None:
    i = Intent(**{**intent().__dict__, "role_services": {"worker": "x-worker"}})
    groups = (group(0), group(1))
    seen = {"x-worker": frozenset({"x-worker-0-0"})}
    c = {x.type: x for x in compute_conditions(i, Observed(groups, UP, seen))}
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "EndpointsPending")
    assert "x-worker-1" in c["Ready"].message
    seen = {"x-worker": frozenset({"x-worker-0-0", "x-worker-1-0"})}
    c = {x.type: x for x in compute_conditions(i, Observed(groups, UP, seen))}
    assert c["Ready"].status == "True"


def test_endpoints_are_read_from_slices_with_unset_ready_meaning_ready() -> None:
    slices = [{"metadata": {"labels": {"kubernetes.io/service-name": "s"}}, "endpoints": [
        {"targetRef": {"kind": "Pod", "name": "a"}, "conditions": {"ready": True}},
        {"targetRef": {"kind": "Pod", "name": "b"}, "conditions": {"ready": False}},
        {"targetRef": {"kind": "Pod", "name": "c"}, "conditions": {}}]}]
    assert observe_endpoints(slices) == {"s": frozenset({"a", "c"})}


def _pod_waiting(name: str, reason: str, *, init: bool = False, deleting: bool = False) -> dict:
    waiting = {"name": "fetch" if init else "worker", "image": "frota-worker:nope",
               "state": {"waiting": {"reason": reason, "message": f"{reason} for frota-worker:nope"}}}
    key = "initContainerStatuses" if init else "containerStatuses"
    meta = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {key: [waiting]}}


def test_image_pull_failures_are_read_from_live_pods_and_init_containers() -> None:
    pods = [
        _pod_waiting("x-worker-1-0", "ImagePullBackOff"),
        _pod_waiting("x-worker-0-0", "ErrImagePull", init=True),
        _pod_waiting("x-worker-2-0", "ContainerCreating"),  # waiting, but not on its image
        _pod_waiting("x-worker-3-0", "ErrImagePull", deleting=True),
    ]
    found = observe_image_problems(pods)
    assert [(p.pod, p.container, p.reason) for p in found] == [
        ("x-worker-0-0", "fetch", "ErrImagePull"), ("x-worker-1-0", "worker", "ImagePullBackOff")]
    assert found[0].image == "frota-worker:nope"


def test_an_image_that_cannot_be_pulled_stops_progressing_and_names_image_and_pod() -> None:
    problem = ImageProblem("x-worker-1-0", "worker", "frota-worker:nope", "ImagePullBackOff",
                           "Back-off pulling image")
    stuck = group(1, pods=(pod("x-worker-1-0", ready=False),))
    observed = Observed((group(0), stuck), UP, image_problems=(problem,))
    c = {x.type: x for x in compute_conditions(intent(), observed)}
    for type_ in ("Ready", "Progressing"):
        assert c[type_].status == "False" and c[type_].reason == "ImagePullFailed", c[type_]
        assert "x-worker-1-0" in c[type_].message and "frota-worker:nope" in c[type_].message
    # Not "in progress": the reconcile settles until the spec or a pod changes.
    assert c["Progressing"].status == "False"


def test_a_serving_fleet_stays_ready_while_a_new_image_fails_to_pull() -> None:
    problem = ImageProblem("x-worker-0-0", "worker", "frota-worker:nope", "ErrImagePull", "")
    observed = Observed((group(0), group(1)), UP, image_problems=(problem, problem))
    c = {x.type: x for x in compute_conditions(intent(), observed)}
    assert c["Ready"].status == "True"
    assert c["Progressing"].reason == "ImagePullFailed"
    assert c["Progressing"].message.endswith("(and 1 more container(s))")


def test_every_condition_carries_a_contract_type_and_reason() -> None:
    groups = (group(0), group(1, rev="r1"))
    for c in compute_conditions(intent(), Observed(groups, UP)):
        assert ConditionType(c.type) and Reason(c.reason)


def test_a_status_round_trips_through_its_wire_form() -> None:
    s = compute_status(intent(), Observed((group(0), group(1)), UP), old=None, now="T")
    wire = s.to_wire()
    assert "capacity" not in wire and wire["conditions"][0]["lastTransitionTime"] == "T"
    assert parse_status(wire) == s
    assert parse_status(None) == InferenceServiceStatus()
    assert parse_status({"replicas": -1}) == InferenceServiceStatus()  # not of its shape
