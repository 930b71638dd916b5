"""One reconciliation of one InferenceService: fetch -> desired -> apply -> status.

Reads top to bottom. `observe` comes from kopf's indexes (a watch-fed cache
of the children), so a reconcile that has nothing to change makes no API
call at all: children that already hold every desired field are not
re-applied, and an unchanged status is not re-written.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf

from frota.api import InferenceServiceStatus
from frota.api.contract import (
    KIND,
    ROUTINE_NOT_READY,
    ConditionType,
    EventReason,
    Label,
    Role,
    condition_event_reason,
)
from frota.operator.loop.children import Applied, Children
from frota.operator.loop.desired import Desired, InvalidSpec, desired_state
from frota.operator.loop.rollout import GroupState, RolloutPlan, plan_rollout
from frota.operator.reports.model_cache_status import model_cache_status
from frota.operator.reports.observe import (
    GroupView,
    Observed,
    observe_endpoints,
    observe_groups,
    observe_image_problems,
    observe_router,
)
from frota.operator.reports.status import (
    FALSE,
    TRUE,
    compute_status,
    invalid_status,
    is_settled,
    now,
    parse_status,
    transitions,
)


class Api(Protocol):
    """The Kubernetes API calls a reconcile makes (`frota.operator.loop.apply.KubeApi`)."""

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete(self, obj: Mapping[str, Any], *, namespace: str | None = None) -> None: ...
    async def patch_status(self, kind: str, namespace: str, name: str,
                           status: Mapping[str, Any]) -> None: ...


@dataclass
class Outcome:
    """What one reconcile did (for metrics, logs and tests)."""

    result: str = "converged"  # converged | progressing | invalid | deleting
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    restarted: dict[str, str] = field(default_factory=dict)  # group -> cause (rollout, failure)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    recheck: bool = False  # some writes are not in the cache yet: reconcile again soon
    status: InferenceServiceStatus | None = None  # what it wrote (or found unchanged)


def contains(actual: Any, wanted: Any) -> bool:
    """Whether `actual` already holds every field of `wanted` (defaults may add more)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and contains(actual[k], v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


def _ref(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


async def reconcile(
    body: Mapping[str, Any],
    children: Children,
    *,
    api: Api,
    old_status: InferenceServiceStatus | None = None,
    applied: Applied | None = None,
    reported_kv: int | None = None,
    reported_adapters: Sequence[Mapping[str, str | None]] | None = None,
    cache_progress: Mapping[str, int | None] | None = None,
) -> Outcome:
    """Converge one InferenceService with its spec and write its status.

    `old_status` is the status last written, when the caller knows it better
    than the (possibly lagging) body does. `reported_kv` is the KV cache, in
    tokens per replica, the serving engines last reported (None: not known);
    `reported_adapters` the LoRA adapters each serving replica lists (None: not known);
    `cache_progress` the model-cache fill pod's last {"bytes", "totalBytes"} (None: none).
    """
    meta = body["metadata"]
    name, namespace = meta["name"], meta.get("namespace") or "default"
    old_status = old_status if old_status is not None else parse_status(body.get("status"))
    outcome = Outcome()
    if meta.get("deletionTimestamp"):
        # Being deleted (maybe foreground, children first): recreating children
        # now would keep the deletion from ever finishing.
        outcome.result = "deleting"
        return outcome

    try:
        desired = desired_state(body)
    except InvalidSpec as exc:
        # Nothing new is created and nothing that exists is touched.
        outcome.result = "invalid"
        outcome.status = invalid_status(
            generation=meta.get("generation"), field_path=exc.field, message=exc.message,
            old=old_status,
        )
        await _write_status(api, body, namespace, name, outcome.status, old_status)
        return outcome

    groups = observe_groups(children.of_kind("StatefulSet"), children.pods)
    plans = _plan(desired, groups)

    applied = applied if applied is not None else Applied()
    if not await _apply_all(api, desired, plans, children, body, outcome, applied):
        outcome.result = "deleting"  # the cached body was behind: the owner is going
        return outcome
    await _delete_groups(api, desired.namespace, plans, children, outcome, applied)
    await _restart_groups(api, desired, plans, groups, children, outcome)

    router = observe_router(_router_deployment(children, name))
    endpoints = (None if children.endpoint_slices is None
                 else observe_endpoints(children.endpoint_slices))
    observed = Observed(groups=_after_actions(desired, plans, groups, outcome), router=router,
                        endpoints=endpoints, image_problems=observe_image_problems(children.pods))
    outcome.status = compute_status(desired.intent, observed, old=old_status, now=now(),
                                    reported_kv=reported_kv, reported_adapters=reported_adapters)
    if job := next((o for o in desired.shared if o["kind"] == "Job"), None):  # spec.model.cache
        name_ = job["metadata"]["name"]
        cache = model_cache_status(children.find("Job", name_), name_, children.pods,
                                   progress=cache_progress)
        outcome.status = outcome.status.model_copy(update={"modelCache": cache})
    outcome.result = "converged" if is_settled(outcome.status) else "progressing"
    await _write_status(api, body, namespace, name, outcome.status, old_status)
    for type_, reason, message in outcome.events:
        kopf.event(dict(body), type=type_, reason=reason, message=message)
    return outcome


def _plan(desired: Desired, groups: Sequence[GroupView]) -> dict[str, RolloutPlan]:
    """One rollout plan per role; roles the spec no longer has are scaled to zero."""
    roles = set(desired.replicas) | {g.role for g in groups}
    plans = {}
    for role in sorted(roles):
        wanted = desired.replicas.get(role, 0)
        states = {g.index: GroupState(g.revision, g.serving) for g in groups if g.role == role}
        plans[role] = plan_rollout(
            replicas=wanted,
            target=desired.revisions.get(role, ""),
            groups=states,
            max_unavailable=desired.max_unavailable.get(role, 0),
            max_surge=desired.max_surge.get(role, 1),
        )
    return plans


async def _apply_all(
    api: Api,
    desired: Desired,
    plans: Mapping[str, RolloutPlan],
    children: Children,
    owner: Mapping[str, Any],
    outcome: Outcome,
    applied: Applied,
) -> bool:
    """Server-side apply every child that is missing or differs from its desired form.

    Returns False, having applied nothing, when a child is missing and the
    owner turns out to be gone or being deleted (see `_owner_is_live`).
    """
    objs: list[dict[str, Any]] = list(desired.shared)
    for role, plan in plans.items():
        for index in plan.apply:
            objs.extend(desired.render_group(role, index))
    # The builders set owner references from the uid; adopt only what lacks one
    # (on a copy: desired objects are shared with the render cache).
    objs = [o if o["metadata"].get("ownerReferences") else _adopted(o, owner) for o in objs]
    now = time.monotonic()
    stale = []
    creating = False
    for obj in objs:
        seen = children.find(obj["kind"], obj["metadata"]["name"])
        if contains(seen, obj):
            applied.confirm(obj, desired.namespace)
        elif applied.covers(obj, seen, desired.namespace, now):
            outcome.recheck = True  # look again once the cache has caught up
        else:
            stale.append(obj)
            creating = creating or seen is None
    if creating and not await _owner_is_live(api, owner, desired.namespace):
        return False
    results = await asyncio.gather(*(api.apply(o) for o in stale))
    for obj, result in zip(stale, results, strict=True):
        applied.record(obj, result, desired.namespace, now)
    outcome.applied.extend(_ref(o) for o in stale)
    return True


async def _owner_is_live(api: Api, owner: Mapping[str, Any], namespace: str) -> bool:
    """Ask the API server, not the cache, whether the owner still stands.

    The owner and its children come from separate watches. When a child's
    deletion reaches us before the owner's deletionTimestamp does, the cache
    says "missing child, live owner", and applying would recreate what a
    deletion (foreground, or held by someone's finalizer) is taking down.
    Creations are rare (a new service, a rollout's surge), so one GET each is cheap.
    """
    live = await api.get(KIND, namespace, owner["metadata"]["name"])
    if live is None or live["metadata"].get("deletionTimestamp"):
        return False
    uid = owner["metadata"].get("uid")
    return uid is None or live["metadata"].get("uid") == uid  # not a namesake made since


def _adopted(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    copied = copy.deepcopy(dict(obj))
    kopf.append_owner_reference(copied, owner=dict(owner))
    return copied


async def _delete_groups(api: Api, namespace: str, plans: Mapping[str, RolloutPlan],
                         children: Children, outcome: Outcome, applied: Applied) -> None:
    """Remove whole groups (scale-down, finished surge, a role the spec dropped)."""
    doomed = []
    for role, plan in plans.items():
        for index in plan.delete:
            for obj in _group_objects(children, role, index):
                doomed.append(obj)
    await asyncio.gather(*(api.delete(o, namespace=namespace) for o in doomed))
    for obj in doomed:
        applied.confirm(obj, namespace)
    outcome.deleted.extend(_ref(o) for o in doomed)
    if doomed:
        kinds = ", ".join(sorted({_ref(o) for o in doomed if o["kind"] == "StatefulSet"}))
        _event(outcome, "Normal", EventReason.GROUPS_REMOVED, f"removed replica groups {kinds}")


def _group_objects(children: Children, role: str, index: int) -> list[Mapping[str, Any]]:
    """The existing non-pod children labelled with one group."""
    return [
        o for o in children.objects
        if (lab := o["metadata"].get("labels") or {}).get(Label.ROLE) == role
        and lab.get(Label.REPLICA) == str(index)
    ]


async def _restart_groups(
    api: Api,
    desired: Desired,
    plans: Mapping[str, RolloutPlan],
    groups: Sequence[GroupView],
    children: Children,
    outcome: Outcome,
) -> None:
    """Delete all pods of groups being replaced or whose rank died, together."""
    replaced = {(role, i) for role, plan in plans.items() for i in plan.replace}
    deleted = {(role, i) for role, plan in plans.items() for i in plan.delete}
    to_restart = [
        g for g in groups
        if (g.role, g.index) not in deleted
        and ((g.role, g.index) in replaced or g.needs_restart)
    ]
    pods = []
    for g in to_restart:
        names = {p.name for p in g.live_pods}
        pods.extend(p for p in children.pods if p["metadata"]["name"] in names)
        outcome.restarted[g.name] = "rollout" if (g.role, g.index) in replaced else "failure"
    await asyncio.gather(*(api.delete(p, namespace=desired.namespace) for p in pods))
    for g in to_restart:
        if (g.role, g.index) in replaced:
            _event(outcome, "Normal", EventReason.GROUP_UPDATING,
                   f"replica group {g.name}: all ranks restart at revision "
                   f"{desired.revisions.get(g.role)}")
        else:
            _event(outcome, "Warning", EventReason.GROUP_RESTARTED,
                   f"replica group {g.name}: a rank failed; all ranks restart together")


def _after_actions(
    desired: Desired,
    plans: Mapping[str, RolloutPlan],
    groups: Sequence[GroupView],
    outcome: Outcome,
) -> tuple[GroupView, ...]:
    """The groups as they are once this reconcile's actions land (status must not lag them)."""
    restarted = set(outcome.restarted)
    by_key = {(g.role, g.index): g for g in groups}
    result = []
    for role, plan in plans.items():
        target = desired.revisions.get(role, "")
        for index in sorted(set(plan.apply) | set(plan.hold) | set(plan.surge)):
            g = by_key.get((role, index))
            if g is None or g.name in restarted:
                ranks = g.ranks if g else 0
                name = g.name if g else f"{desired.name}-{role}-{index}"
                result.append(GroupView(role, index, name, target, ranks, ()))
            elif index in plan.apply and g.revision != target:
                result.append(GroupView(role, index, g.name, target, g.ranks, ()))
            else:
                result.append(g)
    return tuple(result)


def _router_deployment(children: Children, name: str) -> Mapping[str, Any] | None:
    for obj in children.of_kind("Deployment"):
        if (obj["metadata"].get("labels") or {}).get(Label.ROLE) == Role.ROUTER:
            return obj
    return None


async def _write_status(
    api: Api,
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    status: InferenceServiceStatus,
    old: InferenceServiceStatus,
) -> None:
    """Write the status if it changed, and post one event per condition transition."""
    if status == old:
        return
    await api.patch_status(KIND, namespace, name, replacing(status.to_wire(), old.to_wire()))
    first = not old.conditions
    for cond in transitions(status.conditions, old.conditions):
        warn = (cond.type == ConditionType.DEGRADED and cond.status == TRUE) or (
            cond.type in (ConditionType.READY, ConditionType.SPEC_VALID)
            and cond.status == FALSE and cond.reason not in ROUTINE_NOT_READY
        )
        if first and not warn:
            continue  # a new object's initial conditions are not transitions worth an event
        kopf.event(
            dict(body),
            type="Warning" if warn else "Normal",
            reason=condition_event_reason(cond.type, cond.status),
            message=f"{cond.reason}: {cond.message}",
        )


def replacing(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that turns `old` into `new`: fields `new` lacks are set to null
    (a merge patch leaves out fields as they were), nested objects alike."""
    patch: dict[str, Any] = dict(new)
    for name, before in old.items():
        if name not in new:
            patch[name] = None
        elif isinstance(before, Mapping) and isinstance(new[name], Mapping):
            patch[name] = replacing(new[name], before)
    return patch


def _event(outcome: Outcome, type_: str, reason: str, message: str) -> None:
    outcome.events.append((type_, reason, message))
