"""The facts every part of Frota shares, each written down once.

API coordinates, label and annotation keys, the kinds of child the operator
owns, condition types and reasons, event reasons. The operator, the router,
`frota up` and the tests import these names instead of restating the strings.
Plain Python: nothing here imports pydantic, kopf or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

GROUP = "frota.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("fisvc",)
CATEGORIES = ("frota",)
# Annotations the operator writes (kopf's progress, diff-base, the finalizer) live under it.
ANNOTATION_PREFIX = GROUP
FINALIZER = f"{ANNOTATION_PREFIX}/operator"

APP_NAME = "frota"  # the value of Label.NAME on everything Frota makes
OPERATOR_MANAGER = "frota-operator"  # Label.MANAGED_BY, and the server-side apply field manager


class Label:
    """Label keys on every child (plain strings: they are dict keys in every manifest)."""

    NAME = "app.kubernetes.io/name"
    INSTANCE = "app.kubernetes.io/instance"
    COMPONENT = "app.kubernetes.io/component"
    MANAGED_BY = "app.kubernetes.io/managed-by"
    ROLE = "frota.dev/role"
    REPLICA = "frota.dev/replica"
    REVISION = "frota.dev/revision"
    SERVING = "frota.dev/serving"  # on the rank-0 Services the router discovers
    # Set by the StatefulSet controller on every pod (GA in Kubernetes 1.32): the rank.
    POD_INDEX = "apps.kubernetes.io/pod-index"


class Role(StrEnum):
    """What a pod does in a fleet (the value of Label.ROLE)."""

    WORKER = "worker"
    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"


WORKER_ROLES = (Role.WORKER, Role.PREFILL, Role.DECODE)


@dataclass(frozen=True)
class ChildKind:
    """A kind of object the operator creates or reads, with its API coordinates."""

    kind: str
    api_version: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


# What the operator creates and owns (the garbage collector takes them with the owner).
CHILD_KINDS = (
    ChildKind("StatefulSet", "apps/v1", "statefulsets"),
    ChildKind("Deployment", "apps/v1", "deployments"),
    ChildKind("Service", "v1", "services"),
    ChildKind("ConfigMap", "v1", "configmaps"),
    ChildKind("ServiceAccount", "v1", "serviceaccounts"),
    ChildKind("Role", "rbac.authorization.k8s.io/v1", "roles"),
    ChildKind("RoleBinding", "rbac.authorization.k8s.io/v1", "rolebindings"),
    ChildKind("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets"),
    ChildKind("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies"),
)
# What it only reads: the pods of its StatefulSets, the EndpointSlices of its Services.
POD = ChildKind("Pod", "v1", "pods")
ENDPOINT_SLICE = ChildKind("EndpointSlice", "discovery.k8s.io/v1", "endpointslices")
INFERENCE_SERVICE = ChildKind(KIND, API_VERSION, PLURAL)


class ConditionType(StrEnum):
    """The conditions of an InferenceService's status."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SPEC_VALID = "SpecValid"


class Reason(StrEnum):
    """Why a condition says what it says."""

    # Ready
    ALL_REPLICAS_READY = "AllReplicasReady"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    ROUTER_UNAVAILABLE = "RouterUnavailable"
    SCALED_TO_ZERO = "ScaledToZero"
    ENDPOINTS_PENDING = "EndpointsPending"
    # Progressing
    ROLLING_UPDATE = "RollingUpdate"
    SCALING = "Scaling"
    COMPLETE = "Complete"
    # Ready, Progressing: a pod waits for an image the kubelet cannot pull
    IMAGE_PULL_FAILED = "ImagePullFailed"
    # Degraded
    GROUP_RESTARTING = "GroupRestarting"
    BELOW_MIN_AVAILABLE = "BelowMinAvailable"
    AS_EXPECTED = "AsExpected"
    # SpecValid
    VALID = "Valid"
    INVALID_SPEC = "InvalidSpec"


# Not-ready reasons that are part of normal life (start-up, scale to zero, a
# router restart); any other Ready=False is posted as a Warning event.
ROUTINE_NOT_READY = frozenset(
    {Reason.REPLICAS_NOT_READY, Reason.SCALED_TO_ZERO, Reason.ROUTER_UNAVAILABLE}
)


class EventReason(StrEnum):
    """Reasons of the events the operator posts besides condition transitions."""

    GROUPS_REMOVED = "GroupsRemoved"
    GROUP_UPDATING = "GroupUpdating"
    GROUP_RESTARTED = "GroupRestarted"
    RECONCILE_FAILED = "ReconcileFailed"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
