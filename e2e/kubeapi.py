"""A small synchronous Kubernetes REST client built on httpx.

It reads a kubeconfig (file paths or embedded ``*-data`` fields, client
certificates or a bearer token), so it works against kind and the throwaway
apiserver of e2e/apiserver.py alike. Only what bench/operator_scale.py needs.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml


class ApiError(RuntimeError):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"apiserver answered {status}: {body[:500]}")
        self.status = status
        self.body = body


def _material(entry: dict[str, Any], key: str, base: Path, tmp: Path) -> str | None:
    """Return a file path for ``key`` or ``key-data`` (written to ``tmp``)."""
    if entry.get(f"{key}-data"):
        path = tmp / key
        path.write_bytes(base64.b64decode(entry[f"{key}-data"]))
        return str(path)
    if entry.get(key):
        p = Path(entry[key])
        return str(p if p.is_absolute() else base / p)
    return None


class KubeClient:
    """Talks to the apiserver named by the current context of a kubeconfig."""

    def __init__(self, kubeconfig: str | Path, timeout: float = 30.0) -> None:
        path = Path(kubeconfig)
        cfg = yaml.safe_load(path.read_text())
        ctx_name = cfg.get("current-context") or cfg["contexts"][0]["name"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self._tmp = tempfile.TemporaryDirectory(prefix="frota-kubeapi-")
        tmp = Path(self._tmp.name)
        ctx_ssl = ssl.create_default_context(
            cafile=_material(cluster, "certificate-authority", path.parent, tmp)
        )
        if cluster.get("insecure-skip-tls-verify"):
            ctx_ssl.check_hostname = False
            ctx_ssl.verify_mode = ssl.CERT_NONE
        crt = _material(user, "client-certificate", path.parent, tmp)
        key = _material(user, "client-key", path.parent, tmp)
        if crt and key:
            ctx_ssl.load_cert_chain(crt, key)
        headers = {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}
        self.server = cluster["server"].rstrip("/")
        self.http = httpx.Client(
            base_url=self.server, verify=ctx_ssl, headers=headers, timeout=timeout
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()
        self._tmp.cleanup()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request; return the decoded JSON body or raise :class:`ApiError`."""
        content = None if body is None else json.dumps(body)
        resp = self.http.request(
            method, path, content=content, params=params,
            headers={"Content-Type": content_type} if content else None,
        )
        if resp.status_code >= 300:
            raise ApiError(resp.status_code, resp.text)
        return resp.json() if resp.content else None

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` with query ``params``."""
        return self.request("GET", path, params=params or None)

    def post(self, path: str, body: Any) -> Any:
        """POST ``body`` to ``path``."""
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Any) -> Any:
        """Apply a JSON merge patch."""
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        """DELETE ``path`` (``body`` may hold DeleteOptions)."""
        return self.request("DELETE", path, body)

    def watch(self, path: str, resource_version: str, timeout_s: int = 60) -> Iterator[dict]:
        """Yield watch events for a collection from ``resource_version`` on."""
        params = {
            "watch": "true", "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "true",
        }
        with self.http.stream(
            "GET", path, params=params, timeout=httpx.Timeout(10.0, read=timeout_s + 15)
        ) as resp:
            if resp.status_code >= 300:
                raise ApiError(resp.status_code, resp.read().decode())
            for line in resp.iter_lines():
                if line:
                    yield json.loads(line)
