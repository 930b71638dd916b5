"""What every container that downloads gets, whoever builds it: the worker's fetch init
containers (`workers`) and the model-cache Job (`model_cache`) alike: their resources,
the model's credentials and spec.model.caBundle (the ConfigMap's key, mounted, and
SSL_CERT_FILE naming it).

A module of its own because both builders need it and `workers` builds on `model_cache`:
kept in `workers`, it made the two import each other."""

from __future__ import annotations

from typing import Any

from frota.api import InferenceService
from frota.api.contract import Env
from frota.operator.builders import pods

# spec.model.caBundle's key, where every downloading container finds it (SSL_CERT_FILE).
CA_DIR = "/etc/frota/ca"
CA_FILE = f"{CA_DIR}/ca.crt"
FETCH_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}


def ca_bundle(isvc: InferenceService) -> tuple[list, list, list]:
    """spec.model.caBundle as (volumes, mounts, env): the ConfigMap's one key at CA_FILE,
    read-only, and SSL_CERT_FILE naming it (Python's default TLS context reads it), for
    every container that downloads: the fetch init containers and the worker (runtime loads)."""
    ref = isvc.spec.model.caBundle
    if ref is None:
        return [], [], []
    volume = {"name": "ca-bundle", "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": "ca.crt"}]}}
    mount = {"name": "ca-bundle", "mountPath": CA_DIR, "readOnly": True}
    return [volume], [mount], [{"name": "SSL_CERT_FILE", "value": CA_FILE}]


def fetch_env(isvc: InferenceService) -> list[dict[str, Any]]:
    env = list(pods.WRITABLE_HOME_ENV)
    if isvc.spec.model.credentials is not None:
        env.append({"name": Env.HF_TOKEN,
                    "valueFrom": {"secretKeyRef": isvc.spec.model.credentials.to_wire()}})
    return env + ca_bundle(isvc)[2]
