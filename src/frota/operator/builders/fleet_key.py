"""The fleet key's Secret, and how the pods that read it mount it (`contract.FleetKey`).

The Secret is not one of the children `frota render` prints and the reconcile applies:
its key is random, so applying it on every reconcile would rotate it each time, and a
printed key would be a leaked one. The operator creates it once, when it is missing
(`frota.operator.loop.fleet_key`), and never writes it again: a rotation is the user's write.
`fleet_key_secret` is that object without its key; `with_new_key` adds one.

It is mounted as a directory, not through subPath, so that the kubelet's refresh of a
rotated Secret reaches pods that are running.
"""

from __future__ import annotations

import copy
from typing import Any

from frota.api import InferenceService
from frota.api.contract import FleetKey, Label
from frota.api.fleet_key import generate_key
from frota.operator.builders.common import labels, metadata

VOLUME = "fleet-key"
FILE_MODE = 0o440  # the run-as group (the pod's fsGroup) reads it; nobody writes it


def fleet_key_secret_name(isvc: InferenceService) -> str:
    return isvc.metadata.name + FleetKey.SECRET_SUFFIX


def fleet_key_secret(isvc: InferenceService) -> dict[str, Any]:
    """The Secret, owned by the InferenceService, with no key in it yet."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(isvc, fleet_key_secret_name(isvc),
                             labels(isvc, **{Label.COMPONENT: FleetKey.COMPONENT})),
        "type": "Opaque",
    }


def with_new_key(secret: dict[str, Any]) -> dict[str, Any]:
    """A copy of `secret` holding a fresh key (the template is shared: never mutated)."""
    out = copy.deepcopy(secret)
    out["stringData"] = {FleetKey.DATA_KEY: generate_key()}  # the one rule, the readers' own
    return out


def fleet_key_mount(isvc: InferenceService) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(volume, read-only mount, env naming the file) for a container that reads the key."""
    volume = {"name": VOLUME, "secret": {
        "secretName": fleet_key_secret_name(isvc), "defaultMode": FILE_MODE,
        "items": [{"key": FleetKey.DATA_KEY, "path": FleetKey.DATA_KEY}]}}
    mount = {"name": VOLUME, "mountPath": FleetKey.MOUNT_DIR, "readOnly": True}
    env = {"name": FleetKey.FILE_ENV, "value": FleetKey.FILE}
    return volume, mount, env
