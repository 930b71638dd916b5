"""The kopf handlers: thin, each taking only what it uses, handing off to plain functions.

`registry(settings)` registers them on a fresh kopf registry; nothing
registers at import, so the settings (the autoscaling timer's interval among
them) arrive explicitly. Each InferenceService gets a reconcile loop (a kopf
daemon, `frota.operator.loop.converge`); its spec's handlers, the watches on
its children and the capacity timer (what the engines report) only wake
that loop. The watches also feed kopf's indexes, the
cache a reconcile reads the children from, which is how deleted or edited
children come back and how status follows pod readiness. Two paths act on
their own: a new stamp in a fleet's demand ConfigMap brings a fleet at zero
back at once (`frota.operator.scaling.demand`), and a timer brings back a fleet key
Secret that was deleted (`frota.operator.loop.fleet_key`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from frota.api import contract
from frota.api.contract import (
    APP_NAME,
    CHILD_KINDS,
    ENDPOINT_SLICE,
    KIND,
    POD,
    ChildKind,
    Demand,
    Label,
)
from frota.operator.loop import converge, fleet_key, peering
from frota.operator.loop.desired import InvalidSpec, desired_state
from frota.operator.loop.state import OperatorState, key_of, plain
from frota.operator.reports import adapter_report, kv_report, model_cache_progress
from frota.operator.reports.model_cache_status import REASON_CHARS
from frota.operator.reports.observe import IMAGE_PULL_REASONS
from frota.operator.scaling import autoscaler, decisions, demand
from frota.operator.settings import OperatorSettings

ISVC = (contract.GROUP, contract.VERSION, contract.PLURAL)
OWNED = {Label.NAME: APP_NAME, Label.INSTANCE: kopf.PRESENT}
DEMAND = {**OWNED, Label.COMPONENT: Demand.COMPONENT}
INDEXED = (*CHILD_KINDS, POD, ENDPOINT_SLICE)
# How long a stopping reconcile loop may finish its reconcile before kopf cancels it.
STOP_GRACE_SECONDS = 5.0
# How often kopf looks again at a timer still running when its object is deleted: kopf
# cannot cancel a timer, and by default looks once a minute, so a deletion that came while
# a timer's call was out (the fleet key's check, a metrics read) waited that long.
STOP_POLL_SECONDS = 1.0


def index_id(kind: ChildKind) -> str:
    """The id of kopf's in-memory index of one kind (kopf passes indexes as kwargs by id)."""
    return f"frota_{kind.plural}"


def registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    """Every handler of the operator, registered with these settings."""
    reg = kopf.OperatorRegistry()
    kopf.on.startup(registry=reg)(configure)
    kopf.on.startup(registry=reg)(join_peering)
    kopf.on.cleanup(registry=reg)(stop)
    kopf.on.login(registry=reg)(login)

    for kind in CHILD_KINDS:
        kopf.index(kind.group, kind.version, kind.plural, labels=OWNED, id=index_id(kind),
                   registry=reg)(index_child)
    kopf.index(POD.group, POD.version, POD.plural, labels=OWNED, id=index_id(POD),
               registry=reg)(index_pod)
    kopf.index(ENDPOINT_SLICE.group, ENDPOINT_SLICE.version, ENDPOINT_SLICE.plural,
               labels=OWNED, id=index_id(ENDPOINT_SLICE), registry=reg)(index_endpointslice)
    for kind in INDEXED:
        kopf.on.event(kind.group, kind.version, kind.plural, labels=OWNED,
                      id=f"poke_{kind.plural}", registry=reg)(poke_owner)
    # Watch-only (an event handler): nothing is written back to the ConfigMap.
    kopf.on.event("", "v1", "configmaps", labels=DEMAND, id="demand", registry=reg)(
        demand_signalled)

    kopf.daemon(*ISVC, id="converge", registry=reg, cancellation_backoff=STOP_GRACE_SECONDS,
                cancellation_timeout=STOP_GRACE_SECONDS)(converge_inferenceservice)
    for on_change in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on_change(*ISVC, id="wake", registry=reg)(wake_inferenceservice)
    kopf.on.delete(*ISVC, optional=True, registry=reg)(forget_inferenceservice)
    kopf.timer(*ISVC, interval=settings.autoscale_interval_seconds, idle=0, when=_autoscaled,
               registry=reg)(autoscale_inferenceservice)
    kopf.timer(*ISVC, interval=settings.capacity_report_interval_seconds, idle=0,
               id="capacity", registry=reg)(report_capacity)
    # The reconcile loop makes the key first; this brings back one deleted since.
    kopf.timer(*ISVC, interval=settings.fleet_key_check_seconds,
               initial_delay=settings.fleet_key_check_seconds, idle=0, id="fleet_key",
               registry=reg)(ensure_fleet_key)
    return reg


# -- the operator ----------------------------------------------------------------


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """Operator-wide settings, in one place."""
    state: OperatorState = memo["state"]
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=contract.ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=contract.ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = contract.FINALIZER
    settings.posting.loggers = False  # events are the transitions we post, not log lines
    settings.watching.server_timeout = state.settings.watch_timeout_seconds
    settings.background.cancellation_polling = STOP_POLL_SECONDS
    settings.queueing.worker_limit = state.settings.worker_limit
    # kopf passes its indexes as kwargs named by id: live views it keeps filled from the watches.
    state.indexes.update({kind: kwargs[index_id(kind)] for kind in INDEXED})
    await state.open()


async def login(settings: kopf.OperatorSettings, memo: kopf.Memo,
                **_: Any) -> kopf.ConnectionInfo | None:
    """The credentials of kopf's watches, handed to the operator's own client as well."""
    state: OperatorState = memo["state"]
    info = state.login(settings)
    if info is not None:
        await state.kube.connect(info)
    return info


async def join_peering(settings: kopf.OperatorSettings, memo: kopf.Memo,
                       logger: kopf.Logger, **_: Any) -> None:
    """Create the peering object when missing, once logged in (see peering.py)."""
    state: OperatorState = memo["state"]
    memo["peering_task"] = peering.start(settings, state.settings.peering_namespaces,
                                         state.kube, logger)


async def stop(memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo["state"]
    await state.close()


# -- the cache -----------------------------------------------------------------


def index_child(
    body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any
) -> dict[tuple[str, str], dict]:
    """Cache a child under its owner's key (namespace, InferenceService name)."""
    return {(namespace or "default", labels[Label.INSTANCE]): plain(body)}


def index_pod(
    body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any
) -> dict[tuple[str, str], dict]:
    """Cache only what group health (and a role's autoscaler: the pod IP) needs from a rank
    pod, and what status.modelCache needs from a model-cache Job's pod: its owner's uid and
    its containers' termination messages (`frota.operator.reports.model_cache_status`)."""
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
            "ownerReferences": [{"kind": r.get("kind"), "uid": r.get("uid")}
                                for r in body.metadata.get("ownerReferences") or []],
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
    """Restarts, the wait of a container stuck on its image, and how a container ended
    (what status reports)."""
    out: dict[str, Any] = {"name": c.get("name"), "image": c.get("image"),
                           "restartCount": c.get("restartCount", 0)}
    state = c.get("state") or {}
    waiting, terminated = state.get("waiting") or {}, state.get("terminated")
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        out["state"] = {"waiting": {"reason": waiting["reason"],
                                    "message": waiting.get("message", "")}}
    elif terminated is not None:  # a fill's {"bytes": N}, or its error
        out["state"] = {"terminated": _slim_terminated(terminated)}
    # A container waiting to restart (CrashLoopBackOff) keeps why it ended only here: a
    # cache check that failed, naming the file and both digests.
    last = (c.get("lastState") or {}).get("terminated")
    if last is not None:
        out["lastState"] = {"terminated": _slim_terminated(last)}
    return out


def _slim_terminated(terminated: Mapping[str, Any]) -> dict[str, Any]:
    return {"exitCode": terminated.get("exitCode"),
            "message": (terminated.get("message") or "")[:REASON_CHARS]}


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
    state: OperatorState = memo["state"]
    if owner := labels.get(Label.INSTANCE):
        state.poke((namespace or "default", owner))


# -- the InferenceService --------------------------------------------------------
# Handlers that touch the operator state are async: kopf runs sync ones in threads.


async def converge_inferenceservice(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                                    stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Converge children and status with the spec whenever something changes."""
    await converge.run(body, memo["state"], logger=logger, stopped=stopped)


async def wake_inferenceservice(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The spec changed (or the operator resumed): its reconcile loop has work."""
    state: OperatorState = memo["state"]
    state.poke(key_of(body))


async def forget_inferenceservice(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                            **_: Any) -> None:
    """Children go with their owner (owner references); only local state is dropped."""
    state: OperatorState = memo["state"]
    state.forget(key_of(body))
    logger.info("deleted; the garbage collector removes the children it owned")


async def demand_signalled(body: kopf.Body, type: str | None, memo: kopf.Memo,
                           logger: kopf.Logger, **_: Any) -> None:
    """A request waits at the router of a fleet scaled to zero (its demand ConfigMap shows a
    new stamp): one replica, now (the autoscaling timer would see the held request too, an
    interval later). `type` is kopf's name for the event's type: None in a listing."""
    state: OperatorState = memo["state"]
    fleet = demand.news(plain(body), state.demands, listing=type is None)
    if fleet is None:
        return
    owner = await state.kube.get(KIND, *fleet)  # the spec as it is now, not as a cache had it
    if owner is None:
        return
    try:
        isvc = desired_state(plain(owner)).isvc
    except InvalidSpec:
        return
    await autoscaler.wake_from_zero(isvc, state, logger=logger)


async def ensure_fleet_key(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                           **_: Any) -> None:
    """Create the fleet key Secret again if someone deleted it (with a new key)."""
    state: OperatorState = memo["state"]
    if await fleet_key.ensure(state.kube, plain(body)) == "created":
        logger.info("the fleet key Secret was missing: created it with a new key")


def _autoscaled(body: kopf.Body, **_: Any) -> bool:
    """A valid spec with spec.autoscaling or a disaggregated role's autoscaling set."""
    try:
        return decisions.is_autoscaled(desired_state(plain(body)).isvc.spec)
    except InvalidSpec:
        return False


async def autoscale_inferenceservice(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                                     **_: Any) -> None:
    """Scale spec.replicas from the router's queue depth or TTFT, and each autoscaled
    disaggregated role's groups from its own workers' metrics, within bounds."""
    state: OperatorState = memo["state"]
    try:
        isvc = desired_state(plain(body)).isvc
    except InvalidSpec:
        return  # the spec changed since the timer's filter looked: nothing to scale
    await autoscaler.tick(isvc, state.children(key_of(body)).pods, state, logger=logger)


async def report_capacity(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Read the KV cache the serving workers' engines report (status.capacity) and, with
    LoRA on, the adapters they have loaded (status.adapters); the reconcile loop writes them."""
    state: OperatorState = memo["state"]
    try:
        intent = desired_state(plain(body)).intent
    except InvalidSpec:
        return  # nothing serves an invalid spec's revision: status says why instead
    key = key_of(body)
    pods = state.children(key).pods
    await kv_report.refresh(state, key, intent.serving_role, pods)
    await model_cache_progress.refresh(state, key, pods)
    if intent.lora:
        await adapter_report.refresh(state, key, intent.serving_role, pods)
