"""The one seam between the reconciler and the API models, planner and builders.

Everything the reconciler knows about what an InferenceService *should* look
like comes through `desired_state(body)`: the validated spec, the revision
hash, the child objects of each replica group (rendered for any group index,
so rollouts can surge), the shared children (router, config, policies) and
the fleet key's Secret, which is created once and never applied.
When the builders' shapes change, this module is the only one to adjust.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from frota.api import InferenceService
from frota.api.contract import WORKER_ROLES, Label
from frota.operator.builders.fleet_key import fleet_key_secret
from frota.operator.builders.workers import role_service_name
from frota.operator.loop.rollout import resolve_bound
from frota.operator.render import planned_status, render
from frota.operator.reports.status import Intent
from frota.plan.validation import SpecError, load


class InvalidSpec(ValueError):
    """The spec fails semantic validation; `field` is the path under `spec`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Desired:
    """What one InferenceService should consist of right now."""

    isvc: InferenceService  # the validated manifest (metadata and spec)
    name: str
    namespace: str
    revisions: Mapping[str, str]  # per role
    intent: Intent
    max_unavailable: Mapping[str, int]
    max_surge: Mapping[str, int]
    shared: tuple[dict[str, Any], ...]
    fleet_key: dict[str, Any]  # the Secret without its key: created when missing, never applied
    render_group: Callable[[str, int], list[dict[str, Any]]] = field(repr=False)

    @property
    def replicas(self) -> dict[str, int]:
        return self.intent.replicas


def validate(body: Mapping[str, Any]) -> InferenceService:
    """Validate the manifest with the API models; raise InvalidSpec naming the first bad field."""
    try:
        return load(_manifest(body))
    except SpecError as exc:
        raise _invalid(exc) from None


def _invalid(exc: SpecError) -> InvalidSpec:
    first = exc.errors[0]
    return InvalidSpec(first.field.removeprefix("spec."), first.message)


def _manifest(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    keep = ("name", "namespace", "uid", "generation", "labels", "annotations")
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta[k] for k in keep if meta.get(k) is not None},
        "spec": dict(body.get("spec") or {}),
    }


def _with_units(isvc: InferenceService, units: int) -> InferenceService:
    return isvc.model_copy(update={"spec": isvc.spec.model_copy(update={"replicas": units})})


def _group_key(obj: Mapping[str, Any]) -> tuple[str, int] | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    role, replica = labels.get(Label.ROLE), labels.get(Label.REPLICA)
    if role in WORKER_ROLES and replica is not None and replica.isdigit():
        return role, int(replica)
    return None


# Rendering validates, plans and builds every child (milliseconds each); the
# children's watches ask for a reconcile many times per spec change, so the
# result is kept per (uid, generation, spec). Entries are never mutated.
_CACHE_SIZE = 1024
_cache: OrderedDict[str, Desired | InvalidSpec] = OrderedDict()


def desired_state(body: Mapping[str, Any]) -> Desired:
    """Validate, plan and render (cached). Raises InvalidSpec when the spec is wrong.

    The returned objects are shared with the cache: callers must not mutate them.
    """
    meta = body.get("metadata") or {}
    key = json.dumps(
        [meta.get("uid"), meta.get("namespace"), meta.get("name"), meta.get("generation"),
         body.get("spec")], sort_keys=True, default=str,
    )
    found = _cache.get(key)
    if found is None:
        try:
            found = _desired_state(body)
        except InvalidSpec as exc:
            found = exc
        _cache[key] = found
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(key)
    if isinstance(found, InvalidSpec):
        raise InvalidSpec(found.field, found.message)
    return found


def _desired_state(body: Mapping[str, Any]) -> Desired:
    isvc = validate(body)
    try:
        topology, children = render(isvc)
    except SpecError as exc:
        raise _invalid(exc) from None
    spec = isvc.spec
    units = spec.replicas
    per_unit = {shape.role: shape.groups_per_unit for shape in topology.role_shapes}
    revisions = topology.revisions

    max_unavailable = {
        role: resolve_bound(spec.rollout.maxUnavailable, units * n, round_up=False, default=0)
        for role, n in per_unit.items()
    }
    max_surge = {
        role: resolve_bound(spec.rollout.maxSurge, units * n, round_up=True, default=1)
        for role, n in per_unit.items()
    }
    planned = planned_status(isvc, topology)
    intent = Intent(
        generation=isvc.metadata.generation,
        revisions=revisions,
        serving_role=topology.serving_role,
        units=units,
        groups_per_unit=per_unit,
        max_unavailable=max_unavailable,
        selector=planned.selector or "",
        url=planned.url or "",
        mode=topology.mode,
        capacity=planned.capacity,
        role_services={role: role_service_name(isvc, role) for role in per_unit},
        lora=spec.lora is not None,
        adapters=tuple(a.name for a in spec.adapters),
        scale_to_zero=spec.autoscaling is not None and spec.autoscaling.scale_to_zero() is not None,
    )
    shared = tuple(c for c in children if _group_key(c) is None)
    rendered: dict[int, dict[tuple[str, int], list[dict[str, Any]]]] = {}

    def render_group(role: str, index: int) -> list[dict[str, Any]]:
        # Surge groups sit past the spec's count: render as many units as needed.
        needed = max(units, index // per_unit[role] + 1)
        if needed not in rendered:
            objs = children if needed == units else render(_with_units(isvc, needed))[1]
            by_group: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for obj in objs:
                key = _group_key(obj)
                if key is not None:
                    by_group.setdefault(key, []).append(obj)
            rendered[needed] = by_group
        return list(rendered[needed].get((role, index), []))

    return Desired(
        isvc=isvc,
        name=isvc.metadata.name,
        namespace=isvc.metadata.namespace or "default",
        revisions=revisions,
        intent=intent,
        max_unavailable=max_unavailable,
        max_surge=max_surge,
        shared=shared,
        fleet_key=fleet_key_secret(isvc),
        render_group=render_group,
    )
