"""Making sure each fleet has its key: the Secret is created when missing, never written again.

Not applied as the other children are: server-side apply of a random value would rotate
the key on every reconcile, and comparing first would mean reading it. The operator holds
`create` on Secrets and nothing else, so it can read no Secret in the cluster, fleet keys
included: a POST that answers 409 (it exists) is all it learns, and all it needs. A
rotation is the user's own write into the Secret, which the operator never undoes.

When: once per InferenceService (by uid) per operator process, before its first reconcile
applies the pods that mount the key (`ensure_once`, from the reconcile loop), and again
every `fleet_key_check_seconds` (`ensure`, from a timer), so that a Secret the user
deleted comes back, with a new key, without waiting for something else to change.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, Protocol

from frota.api.contract import SECRET
from frota.operator.builders.fleet_key import with_new_key
from frota.operator.loop.apply import collection_path
from frota.operator.loop.desired import InvalidSpec, desired_state

Key = tuple[str, str]  # (namespace, name) of an InferenceService


class Creator(Protocol):
    """The one call this needs (`frota.operator.loop.apply.KubeApi`)."""

    async def create_if_missing(self, path: str, obj: Mapping[str, Any]) -> bool: ...


Outcome = Literal["created", "exists", "not wanted"]


async def ensure(api: Creator, body: Mapping[str, Any]) -> Outcome:
    """Create the fleet key of the InferenceService `body` unless it exists. Not wanted for
    a spec that is invalid (no pod mounts a key yet) or an object going away."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return "not wanted"
    try:
        desired = desired_state(body)
    except InvalidSpec:
        return "not wanted"
    path = collection_path(SECRET.api_version, SECRET.plural, desired.namespace)
    created = await api.create_if_missing(path, with_new_key(desired.fleet_key))
    return "created" if created else "exists"


async def ensure_once(api: Creator, body: Mapping[str, Any],
                      made_sure: MutableMapping[Key, str]) -> Outcome:
    """`ensure`, unless this process has made sure of the key of this very object already
    (`made_sure`: by namespace and name, the uid it did so for)."""
    meta = body["metadata"]
    key, uid = (meta.get("namespace") or "default", meta["name"]), meta.get("uid") or ""
    if made_sure.get(key) == uid:
        return "exists"
    outcome = await ensure(api, body)
    if outcome != "not wanted":
        made_sure[key] = uid
    return outcome
