"""Worker children: per replica group a StatefulSet (one pod per rank) and its headless Service,
per role a Service of the rank-0 pods (what the router discovers), and the engine ConfigMap."""

from __future__ import annotations

from typing import Any

from frota.api import EnvVar, InferenceService, Resources
from frota.api.contract import Env, Label
from frota.operator.builders import model_cache, pods
from frota.operator.builders.common import labels, metadata, selector_labels
from frota.operator.builders.fetch import FETCH_RESOURCES, ca_bundle, fetch_env
from frota.operator.builders.fleet_key import fleet_key_mount
from frota.plan.addressing import MASTER_PORT, WORKER_PORT
from frota.plan.model_shapes import (
    ADAPTER_CACHE_DIR,
    ADAPTERS_DIR,
    CACHE_DIR,
    CONVERTED_DIR,
    MODELS_DIR,
    AdapterLocation,
)
from frota.plan.topology import ReplicaGroup, Topology

# Model load can take many minutes for large weights; the startup probe allows 30.
STARTUP_PERIOD_SECONDS = 10
STARTUP_FAILURES = 180
# Room for each downloaded adapter (a rank-64 adapter of an 8B model is ~170 MiB in bfloat16).
ADAPTER_CACHE_SIZE_MIB = 2048


def engine_configmap_name(isvc: InferenceService) -> str:
    return f"{isvc.metadata.name}-engine"


def role_service_name(isvc: InferenceService, role: str) -> str:
    return f"{isvc.metadata.name}-{role}"


def engine_configmap(isvc: InferenceService, topology: Topology) -> dict[str, Any]:
    """Engine settings shared by all ranks, as FROTA_<FLAG> variables."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(isvc, engine_configmap_name(isvc), labels(isvc)),
        "data": dict(topology.engine_env),
    }


def _resources(resources: Resources) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": resources.cpu, "memory": resources.memory}
    limits: dict[str, Any] = {"memory": resources.memory}
    if resources.accelerator is not None:
        requests[resources.accelerator.resourceName] = resources.accelerator.count
        limits[resources.accelerator.resourceName] = resources.accelerator.count
    return {"requests": requests, "limits": limits}


def _user_env(env: list[EnvVar]) -> list[dict[str, Any]]:
    return [e.to_wire() for e in env]


def _filled_by_frota(isvc: InferenceService, name: str, volume: str, path: str,
                     args: list[str], env: list[dict[str, Any]],
                     resources: dict[str, Any], size: str | None = None,
                     more_mounts: list[dict[str, Any]] | None = None) -> tuple[list, list, list]:
    """An emptyDir at `path` that an init container of Frota's image fills (`frota ARGS`),
    mounted read-only in the worker: (volumes, worker mounts, init containers)."""
    _, tmp_mount = pods.tmp_volume()
    init = pods.frota_container(
        isvc, name, args, env=env, resources=resources,
        volume_mounts=[tmp_mount, {"name": volume, "mountPath": path}, *(more_mounts or [])])
    empty_dir = {"name": volume, "emptyDir": {"sizeLimit": size or isvc.spec.model.cacheSize}}
    return [empty_dir], [{"name": volume, "mountPath": path, "readOnly": True}], [init]


def _fetch(isvc: InferenceService, name: str, volume: str, path: str, uri: str, dest: str,
           size: str | None = None, sha256: str | None = None) -> tuple[list, list, list]:
    """An init container running `frota fetch URI --dest DEST` into the emptyDir `volume`
    (`--sha256`: the pinned digest, enforced on what it downloads)."""
    args = ["fetch", uri, "--dest", dest, *(["--sha256", sha256] if sha256 else [])]
    return _filled_by_frota(isvc, name, volume, path, args, fetch_env(isvc), FETCH_RESOURCES,
                            size, ca_bundle(isvc)[1])


def model_volumes(isvc: InferenceService, topology: Topology) -> tuple[list, list, list]:
    """(volumes, worker mounts, init containers) that deliver the model for its URI scheme."""
    location = topology.model
    if location.delivery == "pvc":
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": location.pvc_claim, "readOnly": True}}
        return [volume], [{"name": "model", "mountPath": MODELS_DIR, "readOnly": True}], []
    if model_cache.enabled(isvc, topology):
        return model_cache.worker_volumes(isvc, topology)  # the Job downloads (converts), once
    if location.delivery != "download":
        return [], [], []  # baked into the image, or generated (synthetic)
    return _fetch(isvc, "fetch-model", "model-cache", CACHE_DIR, location.uri, location.model_arg,
                  sha256=isvc.spec.model.sha256)


def adapter_volumes(isvc: InferenceService, adapters: tuple[AdapterLocation, ...]) -> tuple[list, list, list]:
    """(volumes, worker mounts, init containers) that deliver spec.adapters as the model is
    delivered: each claim mounted read-only once (at ADAPTERS_DIR/pvc/CLAIM), the downloads
    fetched by one init container each into their own directory of one emptyDir."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    claims = list(dict.fromkeys(a.pvc_claim for a in adapters if a.delivery == "pvc"))
    for i, claim in enumerate(claims):
        name = f"adapters-pvc-{i}"  # claim names can outgrow a volume name's 63 characters
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": f"{ADAPTERS_DIR}/pvc/{claim}", "readOnly": True})
    downloads = [a for a in adapters if a.delivery == "download"]
    init: list[dict[str, Any]] = []
    if downloads:
        size = f"{ADAPTER_CACHE_SIZE_MIB * len(downloads)}Mi"
        for i, adapter in enumerate(downloads):
            cache, cache_mount, fetch = _fetch(isvc, f"fetch-adapter-{i}", "adapter-cache",
                                               ADAPTER_CACHE_DIR, adapter.uri, adapter.path, size)
            init += fetch
        volumes += cache
        mounts += cache_mount
    return volumes, mounts, init


def converted_model(isvc: InferenceService, topology: Topology,
                    resources: Resources) -> tuple[list, list, list]:
    """(volumes, worker mounts, init containers) that give the vllm runtime an image-baked
    model as an HF-layout directory: Frota's image runs `frota convert` into an emptyDir."""
    location = topology.model
    if isvc.spec.runtime.engine != "vllm" or location.delivery != "image":
        return [], [], []
    if model_cache.enabled(isvc, topology):
        return [], [], []  # the model-cache Job converted it once (model_volumes mounts it)
    # Converting holds the dequantized model once: the rank's memory is enough.
    return _filled_by_frota(
        isvc, "convert-model", "converted", CONVERTED_DIR,
        ["convert", location.model_arg, f"{CONVERTED_DIR}/{location.model_arg}"],
        list(pods.WRITABLE_HOME_ENV),
        {"requests": {"cpu": resources.cpu, "memory": resources.memory},
         "limits": {"memory": resources.memory}})


def _rank_env(isvc: InferenceService, group: ReplicaGroup) -> list[dict[str, Any]]:
    # Every rank of a group shares the pod template; only FROTA_RANK differs, and
    # the StatefulSet controller's pod-index label supplies it.
    env: list[dict[str, Any]] = [
        {"name": Env.RANK, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{Label.POD_INDEX}']"}}},
    ]
    env += [{"name": k, "value": v} for k, v in group.leader.env.items() if k != Env.RANK]
    if isvc.spec.runtime.engine == "frota":
        env.append({"name": "FROTA_SHUTDOWN_GRACE_PERIOD", "value": str(pods.DRAIN_SECONDS)})
    if _reads_fleet_key(isvc):
        env.append(fleet_key_mount(isvc)[2])
    env += pods.WRITABLE_HOME_ENV
    env += ca_bundle(isvc)[2]  # before the user's env, which may override it
    return env + _user_env(isvc.spec.engine.env)


def _reads_fleet_key(isvc: InferenceService) -> bool:
    """Frota's own engine signs and checks KV handles and internal calls with the fleet key;
    vLLM's server does not read it, so its pods do not get it."""
    return isvc.spec.runtime.engine == "frota"


def _pod_spec(isvc: InferenceService, topology: Topology, group: ReplicaGroup,
              resources: Resources) -> dict[str, Any]:
    spec = isvc.spec
    tmp, tmp_mount = pods.tmp_volume()
    volumes, mounts, init = model_volumes(isvc, topology)
    more_volumes, more_mounts, more_init = converted_model(isvc, topology, resources)
    lora_volumes, lora_mounts, lora_init = adapter_volumes(isvc, topology.adapters)
    ca_volumes, ca_mounts, _ = ca_bundle(isvc)
    volumes = [tmp, *volumes, *more_volumes, *lora_volumes, *ca_volumes]
    mounts = [tmp_mount, *mounts, *more_mounts, *lora_mounts, *ca_mounts]
    if _reads_fleet_key(isvc):
        key, key_mount, _ = fleet_key_mount(isvc)
        volumes.append(key)
        mounts.append(key_mount)
    init = [*init, *more_init, *lora_init]
    if resources.accelerator is not None or spec.runtime.engine == "vllm":
        # NCCL, and vLLM's processes, move data through shared memory; the default /dev/shm
        # is 64 MiB.
        size = "8Gi" if resources.accelerator is not None else "1Gi"
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    launch = group.pod
    container = {
        "name": "worker",
        "image": spec.worker_image,
        "imagePullPolicy": spec.engine.imagePullPolicy,
        "command": list(launch.command),
        "args": list(launch.args),
        "ports": [
            {"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"},
            {"name": "dist", "containerPort": MASTER_PORT, "protocol": "TCP"},
        ],
        "envFrom": [{"configMapRef": {"name": engine_configmap_name(isvc)}}],
        "env": _rank_env(isvc, group),
        "resources": _resources(resources),
        "securityContext": pods.container_security_context(),
        "startupProbe": pods.http_probe(launch.live_path, period=STARTUP_PERIOD_SECONDS, failures=STARTUP_FAILURES),
        "livenessProbe": pods.http_probe(launch.live_path, period=10, failures=3),
        "readinessProbe": pods.http_probe(launch.ready_path, period=5, failures=3),
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": pods.TERMINATION_GRACE_SECONDS,
        "securityContext": pods.pod_security_context(),
        "containers": [container],
        "volumes": volumes,
    }
    if init:
        pod["initContainers"] = init
    placement = spec.placement
    if placement.nodeSelector:
        pod["nodeSelector"] = dict(placement.nodeSelector)
    if placement.tolerations:
        pod["tolerations"] = [t.to_wire() for t in placement.tolerations]
    if placement.affinity:
        pod["affinity"] = placement.affinity
    if placement.priorityClassName:
        pod["priorityClassName"] = placement.priorityClassName
    return pod


def group_selector(isvc: InferenceService, group: ReplicaGroup) -> dict[str, str]:
    """The labels that select exactly one group's pods."""
    return selector_labels(isvc, **{Label.ROLE: group.role, Label.REPLICA: str(group.replica)})


def statefulset(isvc: InferenceService, topology: Topology, group: ReplicaGroup,
                resources: Resources) -> dict[str, Any]:
    """One replica group: one pod per rank, pod G-0 is the leader (the master address)."""
    selector = group_selector(isvc, group)
    pod_labels = labels(isvc, group.role, group.replica, **{Label.REVISION: group.revision})
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(isvc, group.name, pod_labels),
        "spec": {
            "serviceName": group.name,
            "replicas": group.world_size,
            # Ranks rendezvous at start-up, so they must start together, not one by one.
            "podManagementPolicy": "Parallel",
            # The operator replaces a group's pods together: a group never mixes revisions.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": _pod_spec(isvc, topology, group, resources),
            },
        },
    }


def group_service(isvc: InferenceService, group: ReplicaGroup) -> dict[str, Any]:
    """Headless Service giving each rank a stable DNS name (G-N.G); includes unready pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, group.name, labels(isvc, group.role, group.replica)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": group_selector(isvc, group),
            "ports": [
                {"name": "http", "port": WORKER_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "dist", "port": MASTER_PORT, "targetPort": "dist", "protocol": "TCP"},
            ],
        },
    }


def role_service(isvc: InferenceService, role: str) -> dict[str, Any]:
    """Headless Service of the rank-0 pods of one role: its EndpointSlices are what the router watches."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, role_service_name(isvc, role), labels(isvc, role, **{Label.SERVING: "true"})),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(isvc, **{Label.ROLE: role, Label.POD_INDEX: "0"}),
            "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def worker_children(isvc: InferenceService, topology: Topology) -> list[dict[str, Any]]:
    """ConfigMap, role Services, and per group a headless Service plus a StatefulSet."""
    # The claim and the Job that fills it, before the pods that wait for it.
    rank = topology.shape_of(topology.roles[0]).resources if topology.roles else None
    out = [engine_configmap(isvc, topology), *model_cache.cache_children(isvc, topology, rank)]
    out += [role_service(isvc, role) for role in topology.roles]
    for group in topology.groups:
        out.append(group_service(isvc, group))
        out.append(statefulset(isvc, topology, group, topology.shape_of(group.role).resources))
    return out
