"""What the children say, turned into the InferenceService's status (pure).

Nothing here talks to the API: `observe_*` read plain dicts (StatefulSets,
pods, the router Deployment) into small views, and `compute_status` turns the
views into the status block. Ready is true only when every group of the
current revision serves (all its ranks ready, none of another revision) and
the router is up to route to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from frota.api.contract import WORKER_ROLES, ConditionType, Label, Reason

# Waiting reasons of a container whose image the kubelet cannot get: retrying
# will not help until the spec or the registry changes.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)

TRUE, FALSE = "True", "False"


@dataclass(frozen=True)
class PodView:
    """One rank pod, as far as group health is concerned."""

    name: str
    revision: str
    ready: bool
    failed: bool
    restarts: int
    terminating: bool


@dataclass(frozen=True)
class GroupView:
    """One replica group (a StatefulSet) and its rank pods."""

    role: str
    index: int
    name: str
    revision: str
    ranks: int
    pods: tuple[PodView, ...] = ()

    @property
    def live_pods(self) -> tuple[PodView, ...]:
        return tuple(p for p in self.pods if not p.terminating)

    @property
    def serving(self) -> bool:
        """All ranks present, ready, and of the group's own revision."""
        live = self.live_pods
        return (
            self.ranks > 0
            and len(live) == self.ranks
            and all(p.ready and p.revision == self.revision for p in live)
        )

    @property
    def needs_restart(self) -> bool:
        """A rank died or ranks disagree on revision: the group restarts as a whole.

        A rank that failed or restarted has lost its peers' collective state,
        so restarting it alone would hang the group; all ranks start over.
        """
        live = self.live_pods
        if not live or len(live) < len(self.pods):
            return False  # nothing running, or a restart is already under way
        revisions = {p.revision for p in live}
        return any(p.failed or p.restarts > 0 for p in live) or revisions != {self.revision}


@dataclass(frozen=True)
class RouterView:
    """The router Deployment."""

    exists: bool
    replicas: int = 0
    ready_replicas: int = 0

    @property
    def serving(self) -> bool:
        return self.exists and self.ready_replicas > 0


@dataclass(frozen=True)
class ImageProblem:
    """A container of a live pod that waits for an image the kubelet cannot pull."""

    pod: str
    container: str
    image: str
    reason: str
    message: str

    def describe(self) -> str:
        detail = f"{self.reason}: {self.message}" if self.message else self.reason
        return f"pod {self.pod} cannot pull image {self.image} for container {self.container} ({detail})"


@dataclass(frozen=True)
class Observed:
    """Everything status needs to know about the children."""

    groups: tuple[GroupView, ...]
    router: RouterView
    # Ready endpoints (pod names) per Service, from EndpointSlices: what the
    # router discovers. None when not observed (then not checked).
    endpoints: Mapping[str, frozenset[str]] | None = None
    image_problems: tuple[ImageProblem, ...] = ()


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
    mode: str = "Colocated"
    capacity: Mapping[str, Any] = field(default_factory=dict)
    serving_role: str = "worker"
    role_services: Mapping[str, str] = field(default_factory=dict)  # role -> Service the router reads

    @property
    def revision(self) -> str:
        """The revision of the role that serves requests (what status.revision reports)."""
        return self.revisions.get(self.serving_role, "")

    @property
    def replicas(self) -> dict[str, int]:
        """Groups wanted per role."""
        return {role: self.units * n for role, n in self.groups_per_unit.items()}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """Read a rank pod."""
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == ConditionType.READY and c.get("status") == TRUE for c in conditions)
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
    return PodView(
        name=pod["metadata"]["name"],
        revision=_labels(pod).get(Label.REVISION, ""),
        ready=ready,
        failed=status.get("phase") == "Failed",
        restarts=restarts,
        terminating=bool(pod["metadata"].get("deletionTimestamp")),
    )


def observe_groups(
    statefulsets: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> tuple[GroupView, ...]:
    """Join StatefulSets and pods into groups, keyed by role and replica labels."""
    by_group: dict[tuple[str, str], list[PodView]] = {}
    for pod in pods:
        labels = _labels(pod)
        key = (labels.get(Label.ROLE, ""), labels.get(Label.REPLICA, ""))
        by_group.setdefault(key, []).append(pod_view(pod))
    groups = []
    for sts in statefulsets:
        labels = _labels(sts)
        role, replica = labels.get(Label.ROLE, ""), labels.get(Label.REPLICA, "")
        if role not in WORKER_ROLES or not replica.isdigit():
            continue
        groups.append(
            GroupView(
                role=role,
                index=int(replica),
                name=sts["metadata"]["name"],
                revision=labels.get(Label.REVISION, ""),
                ranks=int((sts.get("spec") or {}).get("replicas") or 0),
                pods=tuple(sorted(by_group.get((role, replica), []), key=lambda p: p.name)),
            )
        )
    return tuple(sorted(groups, key=lambda g: (g.role, g.index)))


def observe_image_problems(pods: Iterable[Mapping[str, Any]]) -> tuple[ImageProblem, ...]:
    """Containers (init containers too) of live pods stuck on an image pull, by pod name."""
    found = []
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        for c in [*(status.get("initContainerStatuses") or []),
                  *(status.get("containerStatuses") or [])]:
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMAGE_PULL_REASONS:
                found.append(ImageProblem(
                    pod=pod["metadata"]["name"], container=c.get("name", ""),
                    image=c.get("image", ""), reason=waiting["reason"],
                    message=waiting.get("message", ""),
                ))
    return tuple(sorted(found, key=lambda p: (p.pod, p.container)))


def observe_router(deployment: Mapping[str, Any] | None) -> RouterView:
    """Read the router Deployment (None when it does not exist)."""
    if deployment is None:
        return RouterView(exists=False)
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    return RouterView(
        exists=True,
        replicas=int(spec.get("replicas") or 0),
        ready_replicas=int(status.get("readyReplicas") or 0),
    )


def condition(type_: str, status: bool, reason: str, message: str, generation: int | None) -> dict:
    """One status condition (lastTransitionTime is filled by `merge_conditions`)."""
    out: dict[str, Any] = {
        "type": type_,
        "status": TRUE if status else FALSE,
        "reason": reason,
        "message": message,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def merge_conditions(
    new: Sequence[Mapping[str, Any]], old: Sequence[Mapping[str, Any]] | None, now: str
) -> list[dict]:
    """Keep lastTransitionTime when a condition's status did not change."""
    previous = {c.get("type"): c for c in old or []}
    merged = []
    for cond in new:
        before = previous.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"]
        stamp = before.get("lastTransitionTime") if same and before else None
        merged.append({**cond, "lastTransitionTime": stamp or now})
    return merged


def transitions(
    new: Sequence[Mapping[str, Any]], old: Sequence[Mapping[str, Any]] | None
) -> list[Mapping[str, Any]]:
    """The conditions whose status or reason changed (each becomes one event)."""
    previous = {c.get("type"): c for c in old or []}
    return [
        c
        for c in new
        if (p := previous.get(c["type"])) is None
        or p.get("status") != c["status"]
        or p.get("reason") != c["reason"]
    ]


def invalid_status(
    *, generation: int | None, field_path: str, message: str, old: Mapping[str, Any] | None
) -> dict:
    """Status for a spec the operator refuses: SpecValid=False naming the field.

    The other conditions keep what they said (the children are untouched),
    except that they now refer to this generation.
    """
    old = old or {}
    text = f"spec.{field_path}: {message}" if field_path else message
    kept = [
        {**c, "observedGeneration": generation} if generation is not None else dict(c)
        for c in old.get("conditions") or []
        if c.get("type") != ConditionType.SPEC_VALID
    ]
    spec_valid = condition(ConditionType.SPEC_VALID, False, Reason.INVALID_SPEC, text, generation)
    out = {k: v for k, v in old.items() if k != "conditions"}
    out["conditions"] = [*kept, spec_valid]
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def _role_counts(intent: Intent, groups: Sequence[GroupView]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for role, wanted in intent.replicas.items():
        mine = [g for g in groups if g.role == role]
        target = intent.revisions.get(role, "")
        counts[role] = {
            "replicas": wanted,
            "currentReplicas": len(mine),
            "readyReplicas": sum(1 for g in mine if g.serving),
            "updatedReplicas": sum(1 for g in mine if g.revision == target),
            "updatedReadyReplicas": sum(
                1 for g in mine if g.revision == target and g.serving and g.index < wanted
            ),
        }
    return counts


def _was_serving(old_conditions: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether the fleet served before (so missing capacity is a degradation, not a start-up)."""
    for c in old_conditions or []:
        if c.get("type") == ConditionType.READY and c.get("status") == TRUE:
            return True
        if c.get("type") == ConditionType.DEGRADED and c.get("status") == TRUE:
            return True  # stays degraded until it recovers
    return False


def compute_conditions(
    intent: Intent, observed: Observed, old_conditions: Sequence[Mapping[str, Any]] | None = None
) -> list[dict]:
    """Ready, Progressing, Degraded and SpecValid for a valid spec."""
    gen = intent.generation
    counts = _role_counts(intent, observed.groups)
    total_wanted = sum(intent.replicas.values())
    router = observed.router
    restarting = [g.name for g in observed.groups if g.needs_restart]
    image_message = _image_message(observed.image_problems)

    behind = {
        role: c for role, c in counts.items()
        if c["updatedReadyReplicas"] < c["replicas"] or c["currentReplicas"] != c["replicas"]
    }
    outdated = sum(c["currentReplicas"] - c["updatedReplicas"] for c in counts.values())
    was_serving = _was_serving(old_conditions)
    floor_broken = [
        role for role, c in counts.items()
        if c["readyReplicas"] < c["replicas"] - intent.max_unavailable.get(role, 0)
    ] if was_serving else []

    if not router.serving:
        ready = condition(ConditionType.READY, False, Reason.ROUTER_UNAVAILABLE, "the router has no ready pod", gen)
    elif total_wanted == 0:
        ready = condition(ConditionType.READY, False, Reason.SCALED_TO_ZERO,
            f"scaled to zero replicas; the router stays up at {intent.url}", gen,
        )
    elif behind and observed.image_problems:
        ready = condition(ConditionType.READY, False, Reason.IMAGE_PULL_FAILED, image_message, gen)
    elif behind:
        ready = condition(ConditionType.READY, False, Reason.REPLICAS_NOT_READY, _behind_message(behind), gen)
    elif undiscovered := _undiscovered(intent, observed):
        ready = condition(ConditionType.READY, False, Reason.ENDPOINTS_PENDING,
            "the router has not discovered replica group(s) " + ", ".join(undiscovered)
            + " yet (no ready endpoint for their rank 0)", gen,
        )
    else:
        ready = condition(ConditionType.READY, True, Reason.ALL_REPLICAS_READY,
            f"{_summary(counts)} serving revision {intent.revision} behind the router", gen,
        )

    if observed.image_problems:
        # Like a Deployment past its progress deadline: nothing moves until the
        # image (or the registry's answer) changes, so this is not "in progress".
        progressing = condition(ConditionType.PROGRESSING, False, Reason.IMAGE_PULL_FAILED, image_message, gen)
    elif outdated:
        progressing = condition(ConditionType.PROGRESSING, True, Reason.ROLLING_UPDATE,
            f"{outdated} replica group(s) still on an older revision; rolling group by group", gen,
        )
    elif behind:
        progressing = condition(ConditionType.PROGRESSING, True, Reason.SCALING, _behind_message(behind), gen)
    else:
        progressing = condition(ConditionType.PROGRESSING, False, Reason.COMPLETE, f"all groups at revision {intent.revision}", gen
        )

    if restarting:
        degraded = condition(ConditionType.DEGRADED, True, Reason.GROUP_RESTARTING,
            f"restarting replica group(s) {', '.join(restarting)} as a whole after a rank failed",
            gen,
        )
    elif floor_broken:
        degraded = condition(ConditionType.DEGRADED, True, Reason.BELOW_MIN_AVAILABLE,
            "fewer groups serve than replicas - maxUnavailable for "
            + ", ".join(floor_broken), gen,
        )
    elif not router.serving and was_serving:
        degraded = condition(ConditionType.DEGRADED, True, Reason.ROUTER_UNAVAILABLE, "the router has no ready pod", gen)
    else:
        degraded = condition(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "serving capacity is as planned", gen)

    spec_valid = condition(ConditionType.SPEC_VALID, True, Reason.VALID, "the spec passed validation", gen)
    return [ready, progressing, degraded, spec_valid]


def observe_endpoints(slices: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Ready endpoint pod names per Service, from EndpointSlices (ready unset means ready)."""
    found: dict[str, set[str]] = {}
    for eps in slices:
        service = _labels(eps).get("kubernetes.io/service-name")
        if not service:
            continue
        names = found.setdefault(service, set())
        for ep in eps.get("endpoints") or []:
            ready = (ep.get("conditions") or {}).get("ready")
            target = ep.get("targetRef") or {}
            if ready is not False and target.get("kind", "Pod") == "Pod" and target.get("name"):
                names.add(target["name"])
    return {k: frozenset(v) for k, v in found.items()}


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


def _summary(counts: Mapping[str, Mapping[str, int]]) -> str:
    return ", ".join(f"{c['updatedReadyReplicas']}/{c['replicas']} {role}" for role, c in counts.items())


def _behind_message(behind: Mapping[str, Mapping[str, int]]) -> str:
    return "waiting for replica groups: " + _summary(behind) + " ready at the current revision"


def _units(counts: Mapping[str, Mapping[str, int]], intent: Intent, key: str) -> int:
    """Whole units formed by `key` groups of every role (capped at the wanted units)."""
    if not intent.groups_per_unit:
        return 0
    per_role = [
        min(counts[role][key], counts[role]["replicas"]) // n
        for role, n in intent.groups_per_unit.items() if n > 0
    ]
    return min(per_role) if per_role else 0


def compute_status(
    intent: Intent,
    observed: Observed,
    *,
    old: Mapping[str, Any] | None,
    now: str,
) -> dict:
    """The whole status block for a valid spec (the shape of `frota.api.InferenceServiceStatus`)."""
    counts = _role_counts(intent, observed.groups)
    old_conditions = (old or {}).get("conditions")
    conditions = merge_conditions(
        compute_conditions(intent, observed, old_conditions), old_conditions, now
    )
    out: dict[str, Any] = {
        "replicas": _units(counts, intent, "currentReplicas"),
        "readyReplicas": _units(counts, intent, "updatedReadyReplicas"),
        "roles": [
            {
                "role": role,
                "replicas": c["currentReplicas"],
                "readyReplicas": c["readyReplicas"],
                "updatedReplicas": c["updatedReplicas"],
            }
            for role, c in counts.items()
        ],
        "selector": intent.selector,
        "url": intent.url,
        "mode": intent.mode,
        "revision": intent.revision,
        "conditions": conditions,
    }
    if intent.capacity:
        out["capacity"] = dict(intent.capacity)
    if intent.generation is not None:
        out["observedGeneration"] = intent.generation
    return out
