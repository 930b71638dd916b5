"""Talking to the Kubernetes API: server-side apply, get, delete, status and scale patches.

`KubeApi` is the operator's own client: one aiohttp session for the
operator's lifetime, opened with the credentials kopf's login handler hands
it (`kopf.ConnectionInfo`, public: service account or kubeconfig), so Frota's
requests and kopf's watches authenticate the same way. Its connection limit
caps the operator's requests in flight. Failures are sorted here into
transient ones (`kopf.TemporaryError`, which kopf retries after the
configured delay) and permanent ones (`kopf.PermanentError`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from frota.api.contract import CHILD_KINDS, INFERENCE_SERVICE, OPERATOR_MANAGER, POD
from frota.operator.settings import OperatorSettings

FIELD_MANAGER = OPERATOR_MANAGER
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_CONTENT_TYPE = "application/merge-patch+json"

# kind -> (apiVersion, plural); every kind the operator creates or reads.
KINDS: dict[str, tuple[str, str]] = {
    k.kind: (k.api_version, k.plural) for k in (*CHILD_KINDS, POD, INFERENCE_SERVICE)
}

log = logging.getLogger(__name__)


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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


def _named_path(kind: str, namespace: str, name: str) -> str:
    api_version, plural = KINDS[kind]
    return f"{collection_path(api_version, plural, namespace)}/{name}"


def classify(exc: Exception, what: str, *, retry_delay: float) -> Exception:
    """Turn an API failure into kopf's retry vocabulary."""
    if isinstance(exc, ApiError):
        code = exc.status
        if code in (409, 429) or code >= 500 or code in (401, 403):
            # 409: someone else moved the object; 401/403: credentials or RBAC
            # may be rotating. All of these clear up without a spec change.
            return kopf.TemporaryError(f"{what}: {exc} (HTTP {code}); retrying", delay=retry_delay)
        return kopf.PermanentError(f"{what}: the API server refused it: {exc} (HTTP {code})")
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return kopf.TemporaryError(f"{what}: {exc!r}; retrying", delay=retry_delay)
    return exc


def _is_status(exc: BaseException, code: int) -> bool:
    return isinstance(exc.__cause__, ApiError) and exc.__cause__.status == code


class KubeApi:
    """The operator's requests to the Kubernetes API (kopf's own go through kopf)."""

    def __init__(self, settings: OperatorSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._server = ""
        self._proxy: str | None = None
        self._connected = asyncio.Event()

    async def connect(self, info: kopf.ConnectionInfo) -> None:
        """Use these credentials from now on (each kopf login, the first and any renewal)."""
        old = self._session
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._settings.max_concurrent_requests,
                                           ssl=info.as_ssl_context()),
            headers=info.as_http_headers(),
            timeout=aiohttp.ClientTimeout(total=self._settings.request_timeout_seconds),
            trust_env=info.trust_env,
        )
        self._server, self._proxy = info.server.rstrip("/"), info.proxy_url
        self._connected.set()
        if old is not None:
            await old.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, *, payload: object | None = None,
                       content_type: str | None = None) -> dict[str, Any]:
        what = f"{method} {path}"
        await self._connected.wait()  # kopf logs in after the startup handlers
        assert self._session is not None
        headers = {"Content-Type": content_type} if content_type else None
        try:
            async with self._session.request(
                method, self._server + path, headers=headers, proxy=self._proxy,
                data=None if payload is None else json.dumps(payload),
            ) as response:
                text = await response.text()
                if response.status >= 400:
                    raise ApiError(response.status, _message(text) or response.reason or "")
        except Exception as exc:
            raise classify(exc, what, retry_delay=self._settings.retry_delay_seconds) from exc
        log.debug("%s: HTTP %s", what, response.status)
        return json.loads(text) if text else {}

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply one object under the operator's field manager (force: we own it)."""
        query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        return await self._request("PATCH", f"{object_path(obj)}?{query}", payload=obj,
                                   content_type=APPLY_CONTENT_TYPE)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Read one object from the API server itself (not a watch cache); None when it is gone."""
        try:
            return await self._request("GET", _named_path(kind, namespace, name))
        except kopf.PermanentError as exc:
            if _is_status(exc, 404):
                return None
            raise

    async def delete(self, obj: Mapping[str, Any], *, namespace: str | None = None) -> None:
        """Delete one object (gone already is fine); dependents go in the background."""
        try:
            await self._request("DELETE", object_path(obj, namespace), payload={
                "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
                content_type="application/json")
        except kopf.PermanentError as exc:
            if not _is_status(exc, 404):
                raise

    async def patch_status(self, kind: str, namespace: str, name: str,
                           status: Mapping[str, Any]) -> None:
        """Write the status block through the status subresource (a merge patch: a field
        to remove is given as null; see `reconcile.replacing`)."""
        await self._request("PATCH", f"{_named_path(kind, namespace, name)}/status",
                            payload={"status": dict(status)}, content_type=MERGE_CONTENT_TYPE)

    async def patch_spec_replicas(self, namespace: str, name: str, replicas: int) -> None:
        """Set an InferenceService's replicas through its scale subresource (as kubectl scale does)."""
        path = f"{_named_path(INFERENCE_SERVICE.kind, namespace, name)}/scale"
        await self._request("PATCH", path, payload={"spec": {"replicas": replicas}},
                            content_type=MERGE_CONTENT_TYPE)

    async def patch_role_replicas(self, namespace: str, name: str, role: str,
                                  replicas: int) -> None:
        """Set spec.disaggregation.<role>.replicas of an InferenceService (a merge patch)."""
        await self._request(
            "PATCH", _named_path(INFERENCE_SERVICE.kind, namespace, name),
            payload={"spec": {"disaggregation": {role: {"replicas": replicas}}}},
            content_type=MERGE_CONTENT_TYPE,
        )

    async def create_if_missing(self, path: str, obj: Mapping[str, Any]) -> bool:
        """POST one object to its collection ``path``; False when it exists already (409)."""
        try:
            await self._request("POST", path, payload=obj, content_type="application/json")
        except kopf.TemporaryError as exc:
            if _is_status(exc, 409):
                return False
            raise
        return True


def _message(text: str) -> str:
    """The message of a Kubernetes Status answer, or the text itself."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    return str(body.get("message", "")) if isinstance(body, dict) else text[:500]
