"""Scale to zero's fast path: a fleet's demand ConfigMap shows a new stamp, so one replica now.

The router of a fleet at zero stamps `contract.Demand.DATA_KEY` in its demand ConfigMap
when it holds a request (`frota.router.hold`); that ConfigMap is the one object its Role may
write. The operator watches those ConfigMaps (an event handler: it writes nothing back) and
answers a new stamp with one replica (`autoscaler.wake_from_zero`, which does nothing unless
spec.replicas is 0).

A stamp is news when it differs from the last one this process saw for that fleet. A
stamp first seen in the listing of a watch (the operator starting) is only recorded: an
old stamp must not wake a fleet that has gone idle since; a request held while the
operator was away is seen by the autoscaling tick instead (the router's held-requests
gauge). First seen in an event, it is news: kopf folds events that come close together,
so the ConfigMap's creation and its first stamp may arrive as one. Only a ConfigMap that bears its fleet's own demand name counts: a router can
relabel the ConfigMap it may patch, and must not wake another fleet by naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from frota.api.contract import Demand, Label

Key = tuple[str, str]  # (namespace, name) of an InferenceService


def fleet_of(configmap: Mapping[str, Any]) -> Key | None:
    """The fleet whose demand this ConfigMap is, or None when its name is not that fleet's."""
    meta = configmap.get("metadata") or {}
    fleet = (meta.get("labels") or {}).get(Label.INSTANCE)
    if not fleet or meta.get("name") != fleet + Demand.CONFIGMAP_SUFFIX:
        return None
    return meta.get("namespace") or "default", fleet


def stamp_of(configmap: Mapping[str, Any]) -> str | None:
    """When the router last held a request, as it wrote it (None: never)."""
    return (configmap.get("data") or {}).get(Demand.DATA_KEY)


def news(configmap: Mapping[str, Any], seen: MutableMapping[Key, str | None], *,
         listing: bool = False) -> Key | None:
    """The fleet to bring back when this ConfigMap shows a new demand, else None; `seen`
    (the last stamp of each fleet) is updated either way. `listing`: the ConfigMap comes
    from a watch's listing (kopf's event type None), not from a change."""
    fleet = fleet_of(configmap)
    if fleet is None:
        return None
    stamp = stamp_of(configmap)
    old = listing and fleet not in seen
    before = seen.get(fleet)
    seen[fleet] = stamp
    return fleet if not old and stamp is not None and stamp != before else None
