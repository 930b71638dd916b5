"""Where the workers are: a static list, or Kubernetes EndpointSlices watched live.

Both implement `Discovery`: `start` calls `on_change(urls)` with the full set of
worker base URLs whenever it changes (at least once), until `stop`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

log = logging.getLogger(__name__)

OnChange = Callable[[list[str]], None]
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def parse_worker_urls(spec: str | Iterable[str]) -> list[str]:
    """`http://a:1,b:2` -> ["http://a:1", "http://b:2"] (scheme defaults to http)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    urls = []
    for item in items:
        item = item.strip().rstrip("/")
        if item:
            urls.append(item if "://" in item else f"http://{item}")
    return urls


class Discovery(ABC):
    """A source of worker URLs."""

    @abstractmethod
    async def start(self, session: aiohttp.ClientSession, on_change: OnChange) -> None:
        """Begin reporting; `on_change` gets the whole current set each time it changes."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop reporting and release what `start` took."""


class StaticDiscovery(Discovery):
    """A fixed list of workers (`--workers`), as `frota up` and the tests use."""

    def __init__(self, urls: str | Iterable[str]) -> None:
        self.urls = parse_worker_urls(urls)
        if not self.urls:
            raise ValueError("static discovery needs at least one worker URL (--workers)")

    async def start(self, session: aiohttp.ClientSession, on_change: OnChange) -> None:
        on_change(list(self.urls))

    async def stop(self) -> None:
        return None


@dataclass
class KubeApi:
    """How to reach a Kubernetes API server: base URL, auth and TLS."""

    server: str
    token: str | None = None
    token_file: Path | None = None  # re-read on each connect: projected tokens rotate
    ssl_context: ssl.SSLContext | bool = True
    _tempfiles: list[str] = field(default_factory=list, repr=False)

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        token = self.token
        if self.token_file is not None:
            token = self.token_file.read_text().strip()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @classmethod
    def in_cluster(cls, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeApi:
        """The pod's service account: token and CA mounted by the kubelet."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError("not in a cluster (KUBERNETES_SERVICE_HOST is unset); "
                               "pass --kubeconfig to run outside one")
        if ":" in host:
            host = f"[{host}]"
        context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        return cls(f"https://{host}:{port}", token_file=sa_dir / "token", ssl_context=context)

    @classmethod
    def from_kubeconfig(cls, path: str | Path, context_name: str | None = None) -> KubeApi:
        """The current (or named) context of a kubeconfig file."""
        path = Path(path).expanduser()
        config = yaml.safe_load(path.read_text()) or {}
        base = path.parent

        def named(kind: str, name: str) -> dict[str, Any]:
            for entry in config.get(kind + "s") or []:
                if entry.get("name") == name:
                    return entry.get(kind) or {}
            raise ValueError(f"{path}: no {kind} named {name!r}")

        context = named("context", context_name or config.get("current-context", ""))
        cluster = named("cluster", context["cluster"])
        user = named("user", context["user"]) if context.get("user") else {}
        api = cls(cluster["server"].rstrip("/"))

        def data_or_file(entry: dict[str, Any], key: str) -> str | None:
            if entry.get(f"{key}-data"):
                fd, name = tempfile.mkstemp(suffix=".pem")
                with os.fdopen(fd, "wb") as handle:
                    handle.write(base64.b64decode(entry[f"{key}-data"]))
                api._tempfiles.append(name)
                return name
            value = entry.get(key)
            return str(base / value) if value else None

        if api.server.startswith("https://"):
            if cluster.get("insecure-skip-tls-verify"):
                api.ssl_context = False
            else:
                ctx = ssl.create_default_context(
                    cafile=data_or_file(cluster, "certificate-authority"))
                cert = data_or_file(user, "client-certificate")
                if cert:
                    ctx.load_cert_chain(cert, data_or_file(user, "client-key"))
                api.ssl_context = ctx
        api.token = user.get("token")
        if user.get("tokenFile"):
            api.token_file = base / user["tokenFile"]
        for name in api._tempfiles:  # the SSL context holds what it loaded
            with contextlib.suppress(OSError):
                os.unlink(name)
        return api


class ResourceGone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


def ready_urls(slices: Iterable[dict[str, Any]], port_name: str | None,
               scheme: str = "http") -> list[str]:
    """Worker URLs from EndpointSlices: ready endpoints only, on the named (or first) port."""
    urls: set[str] = set()
    for slice_ in slices:
        ports = slice_.get("ports") or []
        port = next((p.get("port") for p in ports
                     if port_name is None or p.get("name") == port_name), None)
        if port is None:
            continue
        ipv6 = slice_.get("addressType") == "IPv6"
        for endpoint in slice_.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            # The API says an unset `ready` means ready; `terminating` ones are never ready.
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            for address in endpoint.get("addresses") or []:
                host = f"[{address}]" if ipv6 else address
                urls.add(f"{scheme}://{host}:{port}")
    return sorted(urls)


class KubernetesDiscovery(Discovery):
    """Watch `discovery.k8s.io/v1` EndpointSlices matching `selector` in `namespace`.

    List, then watch from the list's resourceVersion; a 410 Gone (history
    compacted) means list again; a dropped connection means watch again from
    the last version seen, after a backoff. Every change of the ready endpoint
    set reaches `on_change` at once: no restart needed.
    """

    def __init__(self, api: KubeApi, namespace: str, selector: str, *,
                 port_name: str | None = None, scheme: str = "http",
                 watch_timeout: int = 300) -> None:
        self.api = api
        self.namespace = namespace
        # The EndpointSlice collection: fixed for the watch's lifetime, so built once.
        self._url = (f"{api.server}/apis/discovery.k8s.io/v1/namespaces/"
                     f"{quote(namespace)}/endpointslices")
        self.selector = selector
        self.port_name = port_name
        self.scheme = scheme
        self.watch_timeout = watch_timeout
        self._slices: dict[str, dict[str, Any]] = {}
        self._urls: list[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._on_change: OnChange = lambda urls: None

    async def start(self, session: aiohttp.ClientSession, on_change: OnChange) -> None:
        self._session, self._on_change = session, on_change
        self._task = asyncio.get_running_loop().create_task(self._run(), name="k8s discovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        backoff = 0.2
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._list()
                resource_version = await self._watch(resource_version)
                backoff = 0.2
            except ResourceGone:
                log.info("endpointslice watch expired (410); listing again")
                resource_version = None
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                log.warning("endpointslice discovery: %r; retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    def _get(self, params: dict[str, str],
             timeout: aiohttp.ClientTimeout) -> aiohttp.client._RequestContextManager:
        assert self._session is not None
        return self._session.get(self._url, params={"labelSelector": self.selector, **params},
                                 headers=self.api.headers(), ssl=self.api.ssl_context,
                                 timeout=timeout)

    async def _list(self) -> str:
        timeout = aiohttp.ClientTimeout(total=30)
        async with self._get({}, timeout) as resp:
            if resp.status != 200:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status,
                    message=f"list endpointslices: {(await resp.text())[:200]}")
            body = await resp.json(content_type=None)
        self._slices = {s["metadata"]["name"]: s for s in body.get("items") or []}
        self._publish()
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, resource_version: str) -> str:
        params = {"watch": "1", "resourceVersion": resource_version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(self.watch_timeout)}
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=self.watch_timeout + 30)
        async with self._get(params, timeout) as resp:
            if resp.status == 410:
                raise ResourceGone()
            if resp.status != 200:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status,
                    message=f"watch endpointslices: {(await resp.text())[:200]}")
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        resource_version = self._apply(json.loads(line), resource_version)
        return resource_version

    def _apply(self, event: dict[str, Any], resource_version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise ResourceGone()
            raise ValueError(f"watch error: {obj.get('message', obj)}")
        metadata = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED"):
            self._slices[metadata["name"]] = obj
        elif kind == "DELETED":
            self._slices.pop(metadata.get("name", ""), None)
        if kind != "BOOKMARK":
            self._publish()
        return str(metadata.get("resourceVersion") or resource_version)

    def _publish(self) -> None:
        urls = ready_urls(self._slices.values(), self.port_name, self.scheme)
        if urls != self._urls:
            log.info("endpointslices: %d ready worker(s): %s", len(urls), ", ".join(urls))
            self._urls = urls
            self._on_change(urls)
