"""The children of one InferenceService as the watches show them, and what this process
applied that the watches do not show yet.

Both are read by a reconcile and kept in the operator state between reconciles; they live
apart from `reconcile` so that the state can hold them without importing the reconcile
(which imports the state's readers in turn).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Children:
    """The children of one InferenceService, as last seen by the watches."""

    objects: tuple[Mapping[str, Any], ...] = ()  # StatefulSets, Services, Deployments, ...
    pods: tuple[Mapping[str, Any], ...] = ()
    endpoint_slices: tuple[Mapping[str, Any], ...] | None = None  # None: not watched

    def of_kind(self, kind: str) -> list[Mapping[str, Any]]:
        return [o for o in self.objects if o.get("kind") == kind]

    def find(self, kind: str, name: str) -> Mapping[str, Any] | None:
        for obj in self.objects:
            if obj.get("kind") == kind and obj["metadata"]["name"] == name:
                return obj
        return None


@dataclass
class Applied:
    """What this process applied and its cache has not caught up with yet.

    Watch events trail the writes that cause them, so a reconcile poked by the
    first child's event would otherwise re-apply its siblings. An object that
    the cache lacks, or holds at an older resourceVersion, is taken as
    converged when this process applied that same content moments ago. Once
    the cache shows the applied version the record goes, so a later deletion
    or edit of the child is repaired as usual.
    """

    window_seconds: float = 30.0
    _records: dict[tuple[str, str, str], tuple[str, int, float]] = field(default_factory=dict)

    @staticmethod
    def _key(obj: Mapping[str, Any], namespace: str) -> tuple[str, str, str]:
        return obj["kind"], obj["metadata"].get("namespace") or namespace, obj["metadata"]["name"]

    @staticmethod
    def _rv(obj: Mapping[str, Any] | None) -> int | None:
        value = ((obj or {}).get("metadata") or {}).get("resourceVersion")
        return int(value) if isinstance(value, str) and value.isdigit() else None

    def covers(self, obj: Mapping[str, Any], seen: Mapping[str, Any] | None, namespace: str,
               now: float) -> bool:
        record = self._records.get(self._key(obj, namespace))
        if record is None:
            return False
        content, applied_rv, when = record
        seen_rv = self._rv(seen)
        if (seen_rv is not None and seen_rv >= applied_rv) or now - when > self.window_seconds:
            del self._records[self._key(obj, namespace)]  # the cache caught up, or too old
            return False
        return content == json.dumps(obj, sort_keys=True)

    def record(self, obj: Mapping[str, Any], result: Mapping[str, Any], namespace: str,
               now: float) -> None:
        rv = self._rv(result)
        if rv is not None:
            self._records[self._key(obj, namespace)] = (json.dumps(obj, sort_keys=True), rv, now)

    def confirm(self, obj: Mapping[str, Any], namespace: str) -> None:
        """The cache shows the object as applied: stop covering for it."""
        self._records.pop(self._key(obj, namespace), None)
