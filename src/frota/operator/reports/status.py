"""The observed children, turned into the InferenceService's status (pure).

`compute_status` turns the views of `frota.operator.reports.observe` and what the
spec asks for (`Intent`) into an `InferenceServiceStatus`; conditions carry
`ConditionType` and `Reason` from the contract; capacity is the plan's, with
the KV cache the engines report beside it. Ready is true only when every
group of the current revision serves (all its ranks ready, none of another
revision) and the router is up to route to them. The model is serialised only
where it is written to the API server.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from frota.api import Capacity, Condition, InferenceServiceStatus, RoleStatus
from frota.api.contract import ConditionType, Reason, Role, WorkerRole
from frota.operator.reports.adapter_status import Listing, adapter_statuses
from frota.operator.reports.observe import GroupView, ImageProblem, Observed

TRUE, FALSE = "True", "False"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Intent:
    """What the spec asks for (after validation), as status needs it.

    `units` is spec.replicas; each unit is `groups_per_unit[role]` groups of
    each role (one worker group when colocated).
    """

    generation: int | None
    revisions: Mapping[str, str]  # per role: prefill and decode roll independently
    units: int
    groups_per_unit: Mapping[str, int]
    max_unavailable: Mapping[str, int]
    selector: str
    url: str
    mode: Literal["Colocated", "Disaggregated"] = "Colocated"
    capacity: Capacity | None = None
    serving_role: WorkerRole = Role.WORKER
    role_services: Mapping[str, str] = field(default_factory=dict)  # role -> Service the router reads
    lora: bool = False  # LoRA on: status.adapters is kept
    adapters: tuple[str, ...] = ()  # spec.adapters' names, in order
    scale_to_zero: bool = False  # autoscaling.minReplicas 0: zero replicas is a serving state

    @property
    def revision(self) -> str:
        """The revision of the role that serves requests (what status.revision reports)."""
        return self.revisions.get(self.serving_role, "")

    @property
    def replicas(self) -> dict[str, int]:
        """Groups wanted per role."""
        return {role: self.units * n for role, n in self.groups_per_unit.items()}


@dataclass(frozen=True)
class RoleCounts:
    """Groups of one role: wanted, existing, serving, at the target revision."""

    wanted: int
    current: int
    ready: int
    updated: int
    updated_ready: int  # at the target revision, serving, and within the wanted count

    @property
    def behind(self) -> bool:
        return self.updated_ready < self.wanted or self.current != self.wanted


def parse_status(raw: Mapping[str, Any] | None) -> InferenceServiceStatus:
    """The status block of a body as the model (empty when unset or not of its shape)."""
    try:
        return InferenceServiceStatus.model_validate(dict(raw or {}))
    except ValidationError as exc:
        # Only this operator writes status and the CRD prunes unknown fields, so
        # this is a hand edit; the next write replaces it.
        log.warning("ignoring a status the API model does not accept: %s", exc)
        return InferenceServiceStatus()


def condition_of(status: InferenceServiceStatus | None,
                 type_: ConditionType) -> Condition | None:
    """One condition of a status, if it has it."""
    return next((c for c in (status.conditions if status else ()) if c.type == type_), None)


def is_settled(status: InferenceServiceStatus) -> bool:
    """Nothing is in progress (Progressing=False): no reason to look again soon."""
    progressing = condition_of(status, ConditionType.PROGRESSING)
    return progressing is not None and progressing.status == FALSE


def condition(type_: ConditionType, status: bool, reason: Reason, message: str,
              generation: int | None) -> Condition:
    """One status condition (lastTransitionTime is filled by `merge_conditions`)."""
    return Condition(type=type_, status=TRUE if status else FALSE, reason=reason,
                     message=message, observedGeneration=generation)


def now() -> str:
    """The time a condition changes, as lastTransitionTime is written (RFC 3339, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    new: Sequence[Condition], old: Sequence[Condition] | None, now: str
) -> list[Condition]:
    """Keep lastTransitionTime when a condition's status did not change."""
    previous = {c.type: c for c in old or ()}
    merged = []
    for cond in new:
        before = previous.get(cond.type)
        same = before is not None and before.status == cond.status
        stamp = before.lastTransitionTime if same and before else None
        merged.append(cond.model_copy(update={"lastTransitionTime": stamp or now}))
    return merged


def transitions(new: Sequence[Condition], old: Sequence[Condition] | None) -> list[Condition]:
    """The conditions whose status or reason changed (each becomes one event)."""
    previous = {c.type: c for c in old or ()}
    return [
        c for c in new
        if (p := previous.get(c.type)) is None or p.status != c.status or p.reason != c.reason
    ]


def invalid_status(
    *, generation: int | None, field_path: str, message: str,
    old: InferenceServiceStatus | None,
) -> InferenceServiceStatus:
    """Status for a spec the operator refuses: SpecValid=False naming the field.

    The other conditions keep what they said (the children are untouched),
    except that they now refer to this generation.
    """
    old = old or InferenceServiceStatus()
    text = f"spec.{field_path}: {message}" if field_path else message
    kept = [
        c.model_copy(update={"observedGeneration": generation}) if generation is not None else c
        for c in old.conditions if c.type != ConditionType.SPEC_VALID
    ]
    spec_valid = condition(ConditionType.SPEC_VALID, False, Reason.INVALID_SPEC, text, generation)
    update: dict[str, Any] = {"conditions": [*kept, spec_valid]}
    if generation is not None:
        update["observedGeneration"] = generation
    return old.model_copy(update=update)


def _role_counts(intent: Intent, groups: Sequence[GroupView]) -> dict[str, RoleCounts]:
    counts = {}
    for role, wanted in intent.replicas.items():
        mine = [g for g in groups if g.role == role]
        target = intent.revisions.get(role, "")
        counts[role] = RoleCounts(
            wanted=wanted,
            current=len(mine),
            ready=sum(1 for g in mine if g.serving),
            updated=sum(1 for g in mine if g.revision == target),
            updated_ready=sum(
                1 for g in mine if g.revision == target and g.serving and g.index < wanted
            ),
        )
    return counts


def _was_serving(old_conditions: Sequence[Condition] | None) -> bool:
    """Whether the fleet served before (so missing capacity is a degradation, not a start-up)."""
    # Degraded=True counts too: it stays degraded until it recovers.
    return any(
        c.type in (ConditionType.READY, ConditionType.DEGRADED) and c.status == TRUE
        for c in old_conditions or ()
    )


def compute_conditions(
    intent: Intent, observed: Observed, old_conditions: Sequence[Condition] | None = None
) -> list[Condition]:
    """Ready, Progressing, Degraded and SpecValid for a valid spec."""
    gen = intent.generation
    counts = _role_counts(intent, observed.groups)
    total_wanted = sum(intent.replicas.values())
    router = observed.router
    restarting = [g.name for g in observed.groups if g.needs_restart]
    image_message = _image_message(observed.image_problems)

    behind = {role: c for role, c in counts.items() if c.behind}
    outdated = sum(c.current - c.updated for c in counts.values())
    was_serving = _was_serving(old_conditions)
    floor_broken = [
        role for role, c in counts.items()
        if c.ready < c.wanted - intent.max_unavailable.get(role, 0)
    ] if was_serving else []

    ready_type = ConditionType.READY
    if not router.serving:
        ready = condition(ready_type, False, Reason.ROUTER_UNAVAILABLE,
                          "the router has no ready pod", gen)
    elif total_wanted == 0 and intent.scale_to_zero:
        # Idle, not broken: the router holds the next request while a replica starts.
        ready = condition(ready_type, True, Reason.SCALED_TO_ZERO,
                          f"scaled to zero replicas while idle; the router at {intent.url} holds "
                          "requests while a replica starts", gen)
    elif total_wanted == 0:
        ready = condition(ready_type, False, Reason.SCALED_TO_ZERO,
                          f"scaled to zero replicas; the router stays up at {intent.url}", gen)
    elif behind and observed.image_problems:
        ready = condition(ready_type, False, Reason.IMAGE_PULL_FAILED, image_message, gen)
    elif behind:
        ready = condition(ready_type, False, Reason.REPLICAS_NOT_READY,
                          _behind_message(behind), gen)
    elif undiscovered := _undiscovered(intent, observed):
        ready = condition(ready_type, False, Reason.ENDPOINTS_PENDING,
                          "the router has not discovered replica group(s) "
                          + ", ".join(undiscovered)
                          + " yet (no ready endpoint for their rank 0)", gen)
    else:
        ready = condition(ready_type, True, Reason.ALL_REPLICAS_READY,
                          f"{_summary(counts)} serving revision {intent.revision} behind the router",
                          gen)

    progressing = _first_that_holds(
        ConditionType.PROGRESSING, gen,
        # Like a Deployment past its progress deadline: nothing moves until the
        # image (or the registry's answer) changes, so this is not "in progress".
        (observed.image_problems, False, Reason.IMAGE_PULL_FAILED, image_message),
        (outdated, True, Reason.ROLLING_UPDATE,
         f"{outdated} replica group(s) still on an older revision; rolling group by group"),
        (behind, True, Reason.SCALING, _behind_message(behind)),
        (True, False, Reason.COMPLETE, f"all groups at revision {intent.revision}"),
    )
    degraded = _first_that_holds(
        ConditionType.DEGRADED, gen,
        (restarting, True, Reason.GROUP_RESTARTING,
         f"restarting replica group(s) {', '.join(restarting)} as a whole after a rank failed"),
        (floor_broken, True, Reason.BELOW_MIN_AVAILABLE,
         "fewer groups serve than replicas - maxUnavailable for " + ", ".join(floor_broken)),
        (not router.serving and was_serving, True, Reason.ROUTER_UNAVAILABLE,
         "the router has no ready pod"),
        (True, False, Reason.AS_EXPECTED, "serving capacity is as planned"),
    )

    spec_valid = condition(ConditionType.SPEC_VALID, True, Reason.VALID,
                           "the spec passed validation", gen)
    return [ready, progressing, degraded, spec_valid]


def _first_that_holds(type_: ConditionType, generation: int | None,
                      *cases: tuple[object, bool, Reason, str]) -> Condition:
    """The condition of the first (test, status, reason, message) whose test is truthy."""
    _, status, reason, message = next(case for case in cases if case[0])
    return condition(type_, status, reason, message, generation)


def _undiscovered(intent: Intent, observed: Observed) -> list[str]:
    """Serving groups of the current revision whose rank 0 the router cannot see yet."""
    if observed.endpoints is None:
        return []
    missing = []
    for g in observed.groups:
        service = intent.role_services.get(g.role)
        wanted = intent.replicas.get(g.role, 0)
        if service is None or g.index >= wanted or not g.serving:
            continue
        if g.revision != intent.revisions.get(g.role):
            continue
        if f"{g.name}-0" not in observed.endpoints.get(service, frozenset()):
            missing.append(g.name)
    return missing


def _image_message(problems: Sequence[ImageProblem]) -> str:
    if not problems:
        return ""
    more = f" (and {len(problems) - 1} more container(s))" if len(problems) > 1 else ""
    return problems[0].describe() + more


def _summary(counts: Mapping[str, RoleCounts]) -> str:
    return ", ".join(f"{c.updated_ready}/{c.wanted} {role}" for role, c in counts.items())


def _behind_message(behind: Mapping[str, RoleCounts]) -> str:
    return "waiting for replica groups: " + _summary(behind) + " ready at the current revision"


def _units(counts: Mapping[str, RoleCounts], intent: Intent, groups: str) -> int:
    """Whole units formed by the `groups` ("current" or "updated_ready") of every role."""
    per_role = [
        min(getattr(counts[role], groups), counts[role].wanted) // n
        for role, n in intent.groups_per_unit.items() if n > 0
    ]
    return min(per_role) if per_role else 0


def compute_status(
    intent: Intent,
    observed: Observed,
    *,
    old: InferenceServiceStatus | None,
    now: str,
    reported_kv: int | None = None,
    reported_adapters: Sequence[Listing] | None = None,
) -> InferenceServiceStatus:
    """The whole status block for a valid spec; `reported_kv` is the KV cache the serving
    engines report (tokens per replica), shown beside the planned capacity;
    `reported_adapters` what each answering serving replica lists in /v1/models (None:
    not read yet)."""
    counts = _role_counts(intent, observed.groups)
    old_conditions = old.conditions if old else None
    conditions = merge_conditions(
        compute_conditions(intent, observed, old_conditions), old_conditions, now
    )
    return InferenceServiceStatus(
        observedGeneration=intent.generation,
        conditions=conditions,
        replicas=_units(counts, intent, "current"),
        readyReplicas=_units(counts, intent, "updated_ready"),
        roles=[
            RoleStatus(role=role, replicas=c.current, readyReplicas=c.ready,
                       updatedReplicas=c.updated)
            for role, c in counts.items()
        ],
        selector=intent.selector,
        url=intent.url,
        mode=intent.mode,
        revision=intent.revision,
        capacity=_capacity(intent.capacity, reported_kv),
        adapters=(adapter_statuses(intent.adapters, reported_adapters, (old.adapters or []) if old else [])
                  if intent.lora else None),
    )


def _capacity(planned: Capacity | None, reported_kv: int | None) -> Capacity | None:
    """The planned capacity, with what the engines report beside it (the plan untouched)."""
    if reported_kv is None:
        return planned
    return (planned or Capacity()).model_copy(
        update={"reportedKvCacheTokensPerReplica": reported_kv})
