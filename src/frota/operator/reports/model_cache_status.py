"""status.modelCache from the model-cache Job and its pods, as the watches see them.

Only what the operator already reads: the Job's status (active, succeeded, its Failed
condition) and its pods' container states. `frota cache fill` writes `{"bytes": N}` to
its termination message when it succeeds, and the Job's container uses
FallbackToLogsOnError, so a failed download's last log line (the FetchError) is the
terminated state's message: no pods/log permission is needed. Progress while it runs
(`progress`: bytes so far and the source's total) is what the running fill pod last
answered on /progress (frota.operator.reports.model_cache_progress says why that way).

A completed Job is not the last word: every worker pod's `wait-model-cache` init container
checks the cache against its manifest (and spec.model.sha256) before the worker loads, and
exits CacheJob.EXIT_PERMANENT with the file and both digests as its termination message when one
differs. Such a pod makes the state Failed with that message as the reason, until its
check passes (a refilled cache) or the pod is gone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from frota.api import ModelCacheStatus
from frota.api.contract import CacheJob
from frota.operator.builders.model_cache import WAIT_CONTAINER

REASON_CHARS = 1024


def model_cache_status(job: Mapping[str, Any] | None, name: str,
                       pods: Sequence[Mapping[str, Any]] = (),
                       progress: Mapping[str, int | None] | None = None) -> ModelCacheStatus:
    """The state of the Job `name` (None: not created or not seen yet); `progress` the
    fill pod's last {"bytes", "totalBytes"} while it runs."""
    if job is None:
        return ModelCacheStatus(state="Pending", job=name)
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    messages = _terminated(job, pods)
    if "Complete" in conditions or status.get("succeeded"):
        if failed_check := _failed_check(pods):
            pod, message = failed_check
            why = f"CheckFailed: pod {pod}: {' '.join(message.split())}"
            return ModelCacheStatus(state="Failed", job=name, reason=why[:REASON_CHARS])
        return ModelCacheStatus(state="Ready", job=name, percent=100, bytes=_bytes(messages))
    if failed := conditions.get("Failed"):
        why = f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
        last = next((m for m in reversed(messages) if m.strip()), "")
        if last:
            why = f"{why}: {' '.join(last.split())}"
        return ModelCacheStatus(state="Failed", job=name, reason=why[:REASON_CHARS])
    if status.get("active"):
        return ModelCacheStatus(state="Downloading", job=name, **_progress(progress))
    return ModelCacheStatus(state="Pending", job=name)


def _terminated(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Termination messages of the Job's pods' containers, oldest pod first."""
    uid = job.get("metadata", {}).get("uid")
    mine = [p for p in pods if uid and any(
        r.get("uid") == uid for r in p.get("metadata", {}).get("ownerReferences") or [])]
    mine.sort(key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "")
    out = []
    for pod in mine:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if message := ((cs.get("state") or {}).get("terminated") or {}).get("message"):
                out.append(message)
    return out


def _failed_check(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(pod, message) of the first worker pod (by name) whose cache check failed last.

    The check's verdict is its init container's termination: the current one, or while
    the kubelet restarts it (CrashLoopBackOff, or running again) the last one. A check
    that then passes ends in exit 0, which clears it."""
    failed = []
    for pod in pods:
        for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if cs.get("name") != WAIT_CONTAINER:
                continue
            verdict = ((cs.get("state") or {}).get("terminated")
                       or (cs.get("lastState") or {}).get("terminated") or {})
            if verdict.get("exitCode") == CacheJob.EXIT_PERMANENT:
                failed.append(((pod.get("metadata") or {}).get("name") or "?", verdict.get("message") or
                               "the cache does not match its manifest (no message)"))
    return min(failed) if failed else None


def _bytes(messages: Sequence[str]) -> int | None:
    for message in reversed(messages):
        try:
            value = json.loads(message).get("bytes")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, int) and value >= 0:
            return value
    return None


def _progress(progress: Mapping[str, int | None] | None) -> dict[str, int]:
    """bytes, totalBytes and percent (floored, so 100 only once Ready) where known."""
    if not progress or progress.get("bytes") is None:
        return {}
    done, total = progress["bytes"], progress.get("totalBytes")
    out = {"bytes": done}
    if total:
        out |= {"totalBytes": total, "percent": min(99, done * 100 // total)}
    return out
