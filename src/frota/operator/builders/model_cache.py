"""spec.model.cache: one PersistentVolumeClaim per InferenceService that one Job fills
(`frota cache fill`), and what each worker pod needs to use it: the claim mounted read-only
at CACHE_DIR (the subPath of this model's key) and an init container that only waits for
the Job's marker (`frota cache wait`). So a pod start never downloads: the Job does, once.

For the vllm runtime a GGUF model (a downloaded .gguf, or one baked into Frota's image) is
converted by the same Job into KEY/converted, the HF layout vLLM reads, before the marker:
the converted form is what is cached, and a pod start converts nothing.

The key is a hash of the URI (its #sha256= fragment included, spec.model.sha256 too, and
whether it is converted; an image-baked model's also names the image): a new model fills
a new directory of the same claim by a new Job, and pods of the old revision keep theirs.

Integrity: `fill` records every file's sha256 in the marker (the cache's manifest) and
enforces spec.model.sha256 at the download; `wait` checks every file against the manifest
and the pin at every pod start, and exits CacheJob.EXIT_PERMANENT with the file and both digests as
its termination message when one differs (`model_cache_status` reports it)."""

from __future__ import annotations

import hashlib
from typing import Any

from frota.api import InferenceService, Resources
from frota.api.contract import CacheJob, Label
from frota.operator.builders import pods
from frota.operator.builders.common import labels, metadata
from frota.operator.builders.fetch import FETCH_RESOURCES, ca_bundle, fetch_env
from frota.plan.model_shapes import CACHE_DIR, CACHED_CONVERSION
from frota.plan.topology import Topology

JOB_MOUNT = "/cache"
VOLUME = "model-cache"
# The Job retries a failed download (network, a killed pod) this many times, each a new
# pod that removes what the last left half-written (DEST.partial-*).
BACKOFF_LIMIT = 4
# A worker's init container waits this long for the Job, then fails and is restarted.
WAIT_SECONDS = 3600
COMPONENT = "model-cache"
MARKER_WAIT_ARGS = ["cache", "wait"]
WAIT_MOUNT = "/model-cache"  # the whole claim, in the wait init container only
WAIT_CONTAINER = "wait-model-cache"
PROGRESS_PORT = 8081  # `frota cache fill --progress-port`: GET CacheJob.PROGRESS_PATH while downloading


def enabled(isvc: InferenceService, topology: Topology) -> bool:
    cache = isvc.spec.model.cache
    return cache is not None and cache.enabled and (
        topology.model.delivery == "download" or topology.converts_into_cache)


def claim_name(isvc: InferenceService) -> str:
    return f"{isvc.metadata.name}-model-cache"


def cache_key(isvc: InferenceService, topology: Topology) -> str:
    what = topology.model.uri
    if isvc.spec.model.sha256:
        what += "\0sha256=" + isvc.spec.model.sha256  # a new pin is checked by a new download
    if topology.converts_into_cache:
        what += "\0converted"  # a directory without the conversion is another directory
        if topology.model.delivery == "image":
            what += "\0" + isvc.spec.engine.image  # the image holds the model
    return hashlib.sha256(what.encode()).hexdigest()[:10]


def job_name(isvc: InferenceService, topology: Topology) -> str:
    return f"{isvc.metadata.name}-model-cache-{cache_key(isvc, topology)}"


def _labels(isvc: InferenceService) -> dict[str, str]:
    return labels(isvc, **{Label.COMPONENT: COMPONENT})


def claim(isvc: InferenceService) -> dict[str, Any]:
    cache = isvc.spec.model.cache
    assert cache is not None
    spec: dict[str, Any] = {"accessModes": [cache.accessMode],
                            "resources": {"requests": {"storage": cache.size}}}
    if cache.storageClassName:
        spec["storageClassName"] = cache.storageClassName
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": metadata(isvc, claim_name(isvc), _labels(isvc)), "spec": spec}


def job(isvc: InferenceService, topology: Topology, resources: Resources | None = None) -> dict[str, Any]:
    """`frota cache fill URI --dest /cache/KEY/PATH --cache-dir /cache/KEY [--sha256 HEX]
    [--convert /cache/KEY/converted]`: the marker /cache/KEY/.frota-cache.json last (PATH
    may be ORG/REPO: the marker is where `wait` looks, not beside PATH). `resources`: a
    rank's, which a conversion needs (it holds the dequantized model once)."""
    key = cache_key(isvc, topology)
    relative = topology.model.model_arg.removeprefix(CACHE_DIR + "/")
    convert = topology.converts_into_cache
    args = ["cache", "fill", topology.model.uri, "--dest", f"{JOB_MOUNT}/{key}/{relative}",
            "--cache-dir", f"{JOB_MOUNT}/{key}", *_pin(isvc), "--progress-port", str(PROGRESS_PORT)]
    if convert:
        args += ["--convert", f"{JOB_MOUNT}/{key}/{CACHED_CONVERSION}"]
    job_resources: dict[str, Any] = FETCH_RESOURCES
    if convert and resources is not None:
        job_resources = {"requests": {"cpu": resources.cpu, "memory": resources.memory},
                         "limits": {"memory": resources.memory}}
    tmp, tmp_mount = pods.tmp_volume()
    ca_volumes, ca_mounts, _ = ca_bundle(isvc)
    container = pods.frota_container(
        isvc, "fill", args, env=fetch_env(isvc), resources=job_resources,
        volume_mounts=[tmp_mount, {"name": VOLUME, "mountPath": JOB_MOUNT}, *ca_mounts],
        # Read by the operator's capacity timer (model_cache_progress): no API access needed.
        ports=[{"name": "progress", "containerPort": PROGRESS_PORT, "protocol": "TCP"}],
        message_from_log=True)  # the error, for status
    pod = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": pods.pod_security_context(),
        "containers": [container],
        "volumes": [tmp, {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim_name(isvc)}},
                    *ca_volumes],
    }
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": metadata(isvc, job_name(isvc, topology), _labels(isvc)),
            "spec": {"backoffLimit": BACKOFF_LIMIT,
                     "podFailurePolicy": {"rules": [
                         {"action": "FailJob", "onExitCodes": {
                             "containerName": "fill", "operator": "In", "values": [CacheJob.EXIT_PERMANENT]}},
                         # A pod evicted or preempted is retried without counting it.
                         {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
                     "template": {"metadata": {"labels": _labels(isvc)}, "spec": pod}}}


def cache_children(isvc: InferenceService, topology: Topology,
                   resources: Resources | None = None) -> list[dict[str, Any]]:
    """The claim and its Job, or nothing while the cache is off (or has nothing to hold)."""
    if not enabled(isvc, topology):
        return []
    return [claim(isvc), job(isvc, topology, resources)]


def _pin(isvc: InferenceService) -> list[str]:
    return ["--sha256", isvc.spec.model.sha256] if isvc.spec.model.sha256 else []


def worker_volumes(isvc: InferenceService, topology: Topology) -> tuple[list, list, list]:
    """(volumes, worker mounts, init containers): the claim's KEY directory read-only at
    CACHE_DIR, and an init container that waits for the marker there, then checks every
    file against it (and spec.model.sha256): at every pod start, before the worker loads.

    The init container mounts the whole claim, not the subPath: a subPath that does not
    exist yet is created by the kubelet (owned by root), which the Job could then not
    write into. By the time the worker container starts, the Job has made it."""
    key = cache_key(isvc, topology)
    mount = {"name": VOLUME, "mountPath": CACHE_DIR, "subPath": key, "readOnly": True}
    _, tmp_mount = pods.tmp_volume()
    init = pods.frota_container(
        isvc, WAIT_CONTAINER,
        [*MARKER_WAIT_ARGS, f"{WAIT_MOUNT}/{key}", "--timeout", str(WAIT_SECONDS), *_pin(isvc)],
        env=list(pods.WRITABLE_HOME_ENV),
        # Hashing reads in 8 MiB pieces on at most 4 threads (frota.engine.loader.digests).
        resources={"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        volume_mounts=[tmp_mount, {"name": VOLUME, "mountPath": WAIT_MOUNT, "readOnly": True}],
        # A mismatch is written there; the log's last lines stand in for any other failure.
        message_from_log=True)
    volume = {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim_name(isvc), "readOnly": True}}
    return [volume], [mount], [init]
