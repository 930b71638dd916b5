"""The kopf handlers: thin, each taking only what it uses, handing off to plain functions.

Importing this module registers the handlers on kopf's default registry.
InferenceService create/update/resume reconcile at once (kopf retries a
`TemporaryError` with backoff); watches on the children feed a cache (kopf
indexes) and poke the owner's reconcile, which is how deleted or edited
children come back and how status follows pod readiness.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from frota.api import contract
from frota.api.contract import APP_NAME, ENDPOINT_SLICE, POD, Label
from frota.operator import autoscale, peering
from frota.operator.observe import IMAGE_PULL_REASONS
from frota.operator.workqueue import ENDPOINT_INDEX, ISVC_INDEX, POD_INDEX, Fleet, index_id

ISVC = (contract.GROUP, contract.VERSION, contract.PLURAL)
OWNED = {Label.NAME: APP_NAME, Label.INSTANCE: kopf.PRESENT}



@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """Operator-wide settings, in one place."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=contract.ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=contract.ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = contract.FINALIZER
    settings.posting.loggers = False  # events are the transitions we post, not log lines
    settings.watching.server_timeout = 270
    settings.queueing.worker_limit = 64
    fleet: Fleet = memo.setdefault("fleet", Fleet())
    # Index kwargs are live views kopf keeps filled from the watches.
    fleet.indexes.update({k: v for k, v in kwargs.items() if k.startswith("frota_")})


@kopf.on.startup()
async def join_peering(settings: kopf.OperatorSettings, memo: kopf.Memo,
                       logger: kopf.Logger, **_: Any) -> None:
    """Create the peering object when missing, once kopf has credentials (see peering.py)."""
    memo["peering_task"] = peering.start(settings, memo.get("peering_namespaces"), logger)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    fleet: Fleet | None = memo.get("fleet")
    if fleet is not None:
        await fleet.stop()


# -- the cache -----------------------------------------------------------------


@kopf.index(*ISVC, id=ISVC_INDEX)
def index_inferenceservice(
    body: kopf.Body, namespace: str, name: str, **_: Any
) -> dict[tuple[str, str], dict]:
    return {(namespace or "default", name): _plain(body)}


def index_child(
    body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any
) -> dict[tuple[str, str], dict]:
    """Cache a child under its owner's key (namespace, InferenceService name)."""
    return {(namespace or "default", labels[Label.INSTANCE]): _plain(body)}


@kopf.index(POD.group, POD.version, POD.plural, labels=OWNED, id=POD_INDEX)
def index_pod(
    body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any
) -> dict[tuple[str, str], dict]:
    """Cache only what group health (and a role's autoscaler: the pod IP) needs from a rank pod."""
    status = body.get("status") or {}
    slim = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": body.metadata.name,
            "namespace": namespace,
            "labels": dict(labels),
            "deletionTimestamp": body.metadata.get("deletionTimestamp"),
            "creationTimestamp": body.metadata.get("creationTimestamp"),
        },
        "status": {
            "phase": status.get("phase"),
            "podIP": status.get("podIP"),
            "conditions": [{"type": c.get("type"), "status": c.get("status")}
                           for c in status.get("conditions") or []],
            "containerStatuses": [_slim_container(c)
                                  for c in status.get("containerStatuses") or []],
            "initContainerStatuses": [_slim_container(c)
                                      for c in status.get("initContainerStatuses") or []],
        },
    }
    return {(namespace or "default", labels[Label.INSTANCE]): slim}


def _slim_container(c: Mapping[str, Any]) -> dict:
    """Restarts, and the wait of a container stuck on its image (what status reports)."""
    out: dict[str, Any] = {"name": c.get("name"), "image": c.get("image"),
                           "restartCount": c.get("restartCount", 0)}
    waiting = (c.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        out["state"] = {"waiting": {"reason": waiting["reason"],
                                    "message": waiting.get("message", "")}}
    return out


@kopf.index(ENDPOINT_SLICE.group, ENDPOINT_SLICE.version, ENDPOINT_SLICE.plural, labels=OWNED,
            id=ENDPOINT_INDEX)
def index_endpointslice(
    body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any
) -> dict[tuple[str, str], dict]:
    """Cache which pods a Service's EndpointSlice lists as ready (what the router discovers)."""
    slim = {
        "metadata": {"name": body.metadata.name, "labels": dict(labels)},
        "endpoints": [
            {"conditions": {"ready": (ep.get("conditions") or {}).get("ready")},
             "targetRef": {"kind": (ep.get("targetRef") or {}).get("kind"),
                           "name": (ep.get("targetRef") or {}).get("name")}}
            for ep in body.get("endpoints") or []
        ],
    }
    return {(namespace or "default", labels[Label.INSTANCE]): slim}


async def poke_owner(memo: kopf.Memo, namespace: str, labels: kopf.Labels, **_: Any) -> None:
    """A child changed or vanished: its InferenceService may need work."""
    fleet: Fleet | None = memo.get("fleet")
    if fleet is not None:
        fleet.kick(namespace, labels.get(Label.INSTANCE))


for _child in contract.CHILD_KINDS:
    kopf.index(_child.group, _child.version, _child.plural, labels=OWNED,
               id=index_id(_child))(index_child)
for _child in (*contract.CHILD_KINDS, POD, ENDPOINT_SLICE):
    kopf.on.event(_child.group, _child.version, _child.plural, labels=OWNED,
                  id=f"poke_{_child.plural}")(poke_owner)


def _plain(body: kopf.Body) -> dict:
    """A plain dict copy without managedFields (the cache holds many of these)."""
    data = dict(body)
    meta = dict(data.get("metadata") or {})
    meta.pop("managedFields", None)
    data["metadata"] = meta
    return data


# -- the InferenceService --------------------------------------------------------


@kopf.on.resume(*ISVC)
@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)
async def reconcile_inferenceservice(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Converge children and status with the spec (kopf retries TemporaryError)."""
    fleet: Fleet = memo["fleet"]
    await fleet.reconcile(_plain(body), logger=logger)


@kopf.on.delete(*ISVC, optional=True)
def forget_inferenceservice(
    namespace: str, name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Children go with their owner (owner references); only local state is dropped."""
    fleet: Fleet = memo["fleet"]
    fleet.forget((namespace or "default", name))
    logger.info("deleted; the garbage collector removes the children it owned")


def _autoscaled(spec: Any, **_: Any) -> bool:
    """spec.autoscaling or a disaggregated role's autoscaling is set."""
    roles = spec.get("disaggregation") or {}
    return bool(spec.get("autoscaling")) or any(
        (roles.get(role) or {}).get("autoscaling") for role in autoscale.ROLES
    )


@kopf.timer(*ISVC, interval=autoscale.INTERVAL_SECONDS, idle=0, when=_autoscaled)
async def autoscale_inferenceservice(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Scale spec.replicas from the router's queue depth or TTFT, and each autoscaled
    disaggregated role's groups from its own workers' metrics, within bounds."""
    fleet: Fleet = memo["fleet"]
    await autoscale.tick(_plain(body), fleet=fleet, logger=logger)
