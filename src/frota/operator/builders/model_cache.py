"""spec.model.cache: one PersistentVolumeClaim per InferenceService that one Job fills
(`frota cache fill`), and what each worker pod needs to use it: the claim mounted read-only
at CACHE_DIR (the subPath of this model's key) and an init container that only waits for
the Job's marker (`frota cache wait`). So a pod start never downloads: the Job does, once.

The key is a hash of the URI (its #sha256= fragment included): a new model fills a new
directory of the same claim by a new Job, and pods of the old revision keep theirs."""

from __future__ import annotations

import hashlib
from typing import Any

from frota.api import InferenceService
from frota.operator.builders import pods
from frota.operator.builders.common import labels, metadata
from frota.operator.builders.workers import FETCH_RESOURCES, ca_bundle, fetch_env
from frota.plan.model_shapes import CACHE_DIR, ModelLocation

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
PROGRESS_PORT = 8081  # `frota cache fill --progress-port`: GET /progress while downloading


def enabled(isvc: InferenceService, location: ModelLocation) -> bool:
    cache = isvc.spec.model.cache
    return cache is not None and cache.enabled and location.delivery == "download"


def claim_name(isvc: InferenceService) -> str:
    return f"{isvc.metadata.name}-model-cache"


def cache_key(location: ModelLocation) -> str:
    return hashlib.sha256(location.uri.encode()).hexdigest()[:10]


def job_name(isvc: InferenceService, location: ModelLocation) -> str:
    return f"{isvc.metadata.name}-model-cache-{cache_key(location)}"


def _labels(isvc: InferenceService) -> dict[str, str]:
    return labels(isvc, **{"app.kubernetes.io/component": COMPONENT})


def claim(isvc: InferenceService) -> dict[str, Any]:
    cache = isvc.spec.model.cache
    assert cache is not None
    spec: dict[str, Any] = {"accessModes": [cache.accessMode],
                            "resources": {"requests": {"storage": cache.size}}}
    if cache.storageClassName:
        spec["storageClassName"] = cache.storageClassName
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": metadata(isvc, claim_name(isvc), _labels(isvc)), "spec": spec}


def job(isvc: InferenceService, location: ModelLocation) -> dict[str, Any]:
    """`frota cache fill URI --dest /cache/KEY/NAME`: the marker /cache/KEY/.frota-cache.json last."""
    key = cache_key(location)
    relative = location.model_arg.removeprefix(CACHE_DIR + "/")
    tmp, tmp_mount = pods.tmp_volume()
    ca_volumes, ca_mounts, _ = ca_bundle(isvc)
    container = {
        "name": "fill",
        "image": isvc.spec.engine.image,
        "imagePullPolicy": isvc.spec.engine.imagePullPolicy,
        "command": ["frota"],
        "args": ["cache", "fill", location.uri, "--dest", f"{JOB_MOUNT}/{key}/{relative}",
                 "--progress-port", str(PROGRESS_PORT)],
        # Read by the operator's capacity timer (model_cache_progress): no API access needed.
        "ports": [{"name": "progress", "containerPort": PROGRESS_PORT, "protocol": "TCP"}],
        "env": fetch_env(isvc),
        "resources": FETCH_RESOURCES,
        "securityContext": pods.container_security_context(),
        # The last lines of the log (the error) become the pod's termination message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [tmp_mount, {"name": VOLUME, "mountPath": JOB_MOUNT}, *ca_mounts],
    }
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
            "metadata": metadata(isvc, job_name(isvc, location), _labels(isvc)),
            "spec": {"backoffLimit": BACKOFF_LIMIT,
                     "template": {"metadata": {"labels": _labels(isvc)}, "spec": pod}}}


def cache_children(isvc: InferenceService, location: ModelLocation) -> list[dict[str, Any]]:
    """The claim and its Job, or nothing while the cache is off (or the model is not downloaded)."""
    if not enabled(isvc, location):
        return []
    return [claim(isvc), job(isvc, location)]


def worker_volumes(isvc: InferenceService, location: ModelLocation) -> tuple[list, list, list]:
    """(volumes, worker mounts, init containers): the claim's KEY directory read-only at
    CACHE_DIR, and an init container that waits for the marker there.

    The init container mounts the whole claim, not the subPath: a subPath that does not
    exist yet is created by the kubelet (owned by root), which the Job could then not
    write into. By the time the worker container starts, the Job has made it."""
    key = cache_key(location)
    mount = {"name": VOLUME, "mountPath": CACHE_DIR, "subPath": key, "readOnly": True}
    _, tmp_mount = pods.tmp_volume()
    init = {
        "name": "wait-model-cache",
        "image": isvc.spec.engine.image,
        "imagePullPolicy": isvc.spec.engine.imagePullPolicy,
        "command": ["frota"],
        "args": [*MARKER_WAIT_ARGS, f"{WAIT_MOUNT}/{key}", "--timeout", str(WAIT_SECONDS)],
        "env": list(pods.WRITABLE_HOME_ENV),
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": pods.container_security_context(),
        "volumeMounts": [tmp_mount, {"name": VOLUME, "mountPath": WAIT_MOUNT, "readOnly": True}],
    }
    volume = {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim_name(isvc), "readOnly": True}}
    return [volume], [mount], [init]
