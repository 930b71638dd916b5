"""What the children say, read into small views (pure).

Nothing here talks to the API: `observe_*` read the plain dicts the watches
cache (StatefulSets, pods, EndpointSlices, the router Deployment) into frozen
views, which `frota.operator.reports.status` turns into the InferenceService's status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from frota.api.contract import WORKER_ROLES, Label

# Waiting reasons of a container whose image the kubelet cannot get: retrying
# will not help until the spec or the registry changes.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
# The pod condition the kubelet sets (Kubernetes' name, not one of Frota's conditions).
POD_READY = "Ready"


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


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """Read a rank pod."""
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == POD_READY and c.get("status") == "True" for c in conditions)
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
