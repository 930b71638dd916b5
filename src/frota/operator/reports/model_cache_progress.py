"""How far the model-cache Job's download is, for status.modelCache (Downloading N%).

The fill pod (`frota cache fill --progress-port`) answers GET /progress with the bytes of
its partial on disk and the source's Content-Length. The operator's capacity timer reads
it from the Job's running pod, by the pod IP it already watches, as it reads the workers'
/metrics, keeps it in the operator state and wakes the reconcile loop, which writes it.

Why this way: the Job then needs no API access (its pod mounts no token), and the
operator no permission beyond what it has. The alternatives each cost RBAC: the pod
annotating itself needs a Role that may patch every pod of the namespace (a Job's pod
names cannot be listed in resourceNames), and reading the pod's log needs pods/log.
The price is an update per timer interval (--capacity-report-interval), not a live one.
No HTTP happens inside a reconcile."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from frota.api.contract import CacheJob, Label
from frota.operator.builders.model_cache import COMPONENT, PROGRESS_PORT
from frota.operator.loop.state import Key, OperatorState


def fill_pod_urls(pods: Sequence[Mapping[str, Any]], port: int = PROGRESS_PORT) -> list[str]:
    """The progress URL (CacheJob.PROGRESS_PATH) of each running model-cache fill pod."""
    urls = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if (meta.get("labels") or {}).get(Label.COMPONENT) != COMPONENT:
            continue
        if status.get("phase") == "Running" and (ip := status.get("podIP")):
            host = f"[{ip}]" if ":" in ip else ip
            urls.append(f"http://{host}:{port}{CacheJob.PROGRESS_PATH}")
    return urls


def parse(text: str) -> dict[str, int | None] | None:
    """{"bytes": N, "totalBytes": M or None} from a /progress body, or None when it is not one."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    done, total = body.get("bytes"), body.get("totalBytes")
    if not _count(done) or not (total is None or _count(total)):
        return None
    return {"bytes": done, "totalBytes": total}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


async def read(session: aiohttp.ClientSession, url: str) -> dict[str, int | None] | None:
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return None
            return parse(await response.text())
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None  # the pod is starting, finishing or unreachable: no news


async def refresh(state: OperatorState, key: Key, pods: Sequence[Mapping[str, Any]],
                  port: int = PROGRESS_PORT) -> None:
    """Read the running fill pod's progress; when it moved, wake the reconcile loop.

    No running fill pod: the progress is forgotten (the Job's status tells the rest). A
    pod that does not answer keeps the last reading."""
    if state.http is None:
        return
    urls = fill_pod_urls(pods, port)
    if not urls:
        progress = None
    elif (progress := next((p for p in [await read(state.http, u) for u in urls] if p), None)) is None:
        return
    if state.cache_progress.get(key) != progress:
        if progress is None:
            state.cache_progress.pop(key, None)
        else:
            state.cache_progress[key] = progress
        state.poke(key)
