"""Talking to the Kubernetes API: server-side apply, list, delete, status.

Requests go through kopf's own API client, so they share its credentials
(kubeconfig, in-cluster service account, or whatever a login handler put in
the vault), its connection pool, and its retries of 5xx/429 with backoff.
Errors that remain are sorted here into transient ones (`kopf.TemporaryError`,
retried by kopf with backoff) and permanent ones (`kopf.PermanentError`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
import weakref
from collections.abc import Mapping
from typing import Any

import kopf

# kopf exposes no public raw-request API; this private module is the client
# kopf itself uses, and it is the one place Frota depends on it.
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors

from frota.api.contract import CHILD_KINDS, INFERENCE_SERVICE, OPERATOR_MANAGER, POD

FIELD_MANAGER = OPERATOR_MANAGER
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_CONTENT_TYPE = "application/merge-patch+json"

# kind -> (apiVersion, plural); every kind the operator creates or reads.
KINDS: dict[str, tuple[str, str]] = {
    k.kind: (k.api_version, k.plural) for k in (*CHILD_KINDS, POD, INFERENCE_SERVICE)
}

# How long kopf waits before retrying a reconcile that hit a transient error.
RETRY_DELAY_SECONDS = 5.0
# Requests of the operator's own in flight at once, across all reconciles. Each
# concurrent request can open a TLS connection (about 130 KiB of buffers), and
# a burst of creates would otherwise open hundreds; a few suffice to keep the
# API server busy.
MAX_CONCURRENT_REQUESTS = 16
_limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)

APIError = kopf_errors.APIError
NotFound = kopf_errors.APINotFoundError


def collection_path(api_version: str, plural: str, namespace: str) -> str:
    """The URL path of a namespaced collection."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{plural}"


def object_path(obj: Mapping[str, Any], namespace: str | None = None) -> str:
    """The URL path of one object, from its apiVersion, kind, namespace and name."""
    api_version, plural = KINDS[obj["kind"]]
    meta = obj["metadata"]
    ns = meta.get("namespace") or namespace
    if not ns:
        raise ValueError(f"{obj['kind']} {meta.get('name')} has no namespace")
    return f"{collection_path(api_version, plural, ns)}/{meta['name']}"


# Request timeouts and retry backoffs of the operator's own requests: kopf's
# defaults (the operator-wide settings apply to kopf's watches and patches).
_SETTINGS = kopf.OperatorSettings()


def classify(exc: Exception, what: str) -> Exception:
    """Turn an API failure into kopf's retry vocabulary."""
    if isinstance(exc, kopf_errors.APIError):
        code = exc.status or 0
        if code in (409, 429) or code >= 500 or code in (401, 403):
            # 409: someone else moved the object; 401/403: credentials or RBAC
            # may be rotating. All of these clear up without a spec change.
            return kopf.TemporaryError(f"{what}: {exc} (HTTP {code}); retrying",
                                       delay=RETRY_DELAY_SECONDS)
        return kopf.PermanentError(f"{what}: the API server refused it: {exc} (HTTP {code})")
    if isinstance(exc, TimeoutError | OSError):
        return kopf.TemporaryError(f"{what}: {exc!r}; retrying", delay=RETRY_DELAY_SECONDS)
    return exc


async def _request(
    method: str,
    path: str,
    *,
    logger: logging.Logger | logging.LoggerAdapter,
    payload: object | None = None,
    content_type: str | None = None,
) -> dict[str, Any]:
    headers = {"Content-Type": content_type} if content_type else None
    loop = asyncio.get_running_loop()
    limit = _limits.setdefault(loop, asyncio.Semaphore(MAX_CONCURRENT_REQUESTS))
    try:
        async with limit:
            response = await kopf_api.request(
                method, path, payload=payload, headers=headers, settings=_SETTINGS, logger=logger
            )
            text = await response.text()
    except Exception as exc:
        raise classify(exc, f"{method} {path}") from exc
    return json.loads(text) if text else {}


async def apply(obj: Mapping[str, Any], *, logger: Any) -> dict[str, Any]:
    """Server-side apply one object under the operator's field manager (force: we own it)."""
    query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
    return await _request(
        "PATCH", f"{object_path(obj)}?{query}",
        payload=obj, content_type=APPLY_CONTENT_TYPE, logger=logger,
    )


async def get(kind: str, namespace: str, name: str, *, logger: Any) -> dict[str, Any] | None:
    """Read one object from the API server itself (not a watch cache); None when it is gone."""
    api_version, plural = KINDS[kind]
    try:
        return await _request("GET", f"{collection_path(api_version, plural, namespace)}/{name}",
                              logger=logger)
    except kopf.PermanentError as exc:
        if isinstance(exc.__cause__, NotFound):
            return None
        raise


async def delete(obj: Mapping[str, Any], *, logger: Any, namespace: str | None = None) -> None:
    """Delete one object (gone already is fine); dependents go in the background."""
    try:
        await _request(
            "DELETE", object_path(obj, namespace),
            payload={"kind": "DeleteOptions", "apiVersion": "v1",
                     "propagationPolicy": "Background"},
            logger=logger,
        )
    except kopf.PermanentError as exc:
        if not isinstance(exc.__cause__, NotFound):
            raise


async def patch_status(
    kind: str, namespace: str, name: str, status: Mapping[str, Any], *, logger: Any
) -> None:
    """Replace the status block through the status subresource (merge patch)."""
    api_version, plural = KINDS[kind]
    path = f"{collection_path(api_version, plural, namespace)}/{name}/status"
    await _request("PATCH", path, payload={"status": dict(status)},
                   content_type=MERGE_CONTENT_TYPE, logger=logger)


async def patch_spec_replicas(namespace: str, name: str, replicas: int, *, logger: Any) -> None:
    """Set an InferenceService's replicas through its scale subresource (as kubectl scale does)."""
    api_version, plural = KINDS["InferenceService"]
    path = f"{collection_path(api_version, plural, namespace)}/{name}/scale"
    await _request("PATCH", path, payload={"spec": {"replicas": replicas}},
                   content_type=MERGE_CONTENT_TYPE, logger=logger)


async def patch_role_replicas(namespace: str, name: str, role: str, replicas: int, *,
                              logger: Any) -> None:
    """Set spec.disaggregation.<role>.replicas of an InferenceService (a merge patch)."""
    api_version, plural = KINDS["InferenceService"]
    path = f"{collection_path(api_version, plural, namespace)}/{name}"
    await _request("PATCH", path, payload={"spec": {"disaggregation": {role: {"replicas": replicas}}}},
                   content_type=MERGE_CONTENT_TYPE, logger=logger)


async def create_if_missing(path: str, obj: Mapping[str, Any], *, logger: Any) -> bool:
    """POST one object to its collection ``path``; False when it exists already (409)."""
    try:
        await _request("POST", path, payload=obj, logger=logger)
    except kopf.TemporaryError as exc:
        cause = exc.__cause__
        if isinstance(cause, kopf_errors.APIError) and cause.status == 409:
            return False
        raise
    return True
