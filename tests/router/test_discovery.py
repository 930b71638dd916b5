"""Discovery: the static list, and EndpointSlices from a fake Kubernetes API server."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from frota.router.discovery import (
    KubeApi,
    KubernetesDiscovery,
    StaticDiscovery,
    parse_worker_urls,
    ready_urls,
)
from tests.router.conftest import wait_until


def endpoint_slice(name: str, addresses: dict[str, bool | None], rv: str, port: int = 8000,
                   port_name: str = "http") -> dict:
    endpoints = []
    for address, ready in addresses.items():
        conditions = {} if ready is None else {"ready": ready}
        endpoints.append({"addresses": [address], "conditions": conditions})
    return {"metadata": {"name": name, "resourceVersion": rv},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "metrics", "port": 9000}, {"name": port_name, "port": port}]}


def test_parse_worker_urls_defaults_the_scheme_and_trims():
    assert parse_worker_urls(" http://a:1/ ,b:2,,") == ["http://a:1", "http://b:2"]


async def test_static_discovery_reports_its_list_once():
    seen: list[list[str]] = []
    discovery = StaticDiscovery("a:1,b:2")
    await discovery.start(None, seen.append)  # type: ignore[arg-type]
    assert seen == [["http://a:1", "http://b:2"]]
    with pytest.raises(ValueError):
        StaticDiscovery("")


def test_ready_urls_keep_ready_endpoints_on_the_named_port():
    slices = [endpoint_slice("s1", {"10.0.0.1": True, "10.0.0.2": False, "10.0.0.3": None},
                             "1"),
              {**endpoint_slice("s2", {"fd00::1": True}, "1"), "addressType": "IPv6"}]
    assert ready_urls(slices, "http") == [
        "http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::1]:8000"]
    assert ready_urls(slices, None)[0] == "http://10.0.0.1:9000"  # first port


@dataclass
class FakeApiServer:
    """Serves EndpointSlice list and watch like the Kubernetes API, from a script."""

    items: dict[str, dict] = field(default_factory=dict)
    resource_version: int = 1
    watches: list[asyncio.Queue] = field(default_factory=list)
    expire_next_watch: bool = False
    requests: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert request.match_info["ns"] == "serving"
        assert request.headers["Authorization"] == "Bearer t0ken"
        self.requests.append(dict(request.query))
        assert request.query["labelSelector"] == "frota.dev/role=worker"
        if request.query.get("watch") != "1":
            return web.json_response({"kind": "EndpointSliceList",
                                      "metadata": {"resourceVersion": str(self.resource_version)},
                                      "items": list(self.items.values())})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if self.expire_next_watch:
            self.expire_next_watch = False
            await response.write(json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "code": 410, "reason": "Expired"}}).encode() + b"\n")
            return response
        queue: asyncio.Queue = asyncio.Queue()
        self.watches.append(queue)
        while (event := await queue.get()) is not None:
            # Split one event across writes: the client must reassemble lines.
            data = json.dumps(event).encode() + b"\n"
            await response.write(data[:10])
            await response.write(data[10:])
        return response

    def emit(self, kind: str, obj: dict) -> None:
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        if kind == "DELETED":
            self.items.pop(obj["metadata"]["name"], None)
        else:
            self.items[obj["metadata"]["name"]] = obj
        for queue in self.watches:
            queue.put_nowait({"type": kind, "object": obj})

    def end_watches(self) -> None:
        for queue in self.watches:
            queue.put_nowait(None)
        self.watches.clear()


@pytest.fixture
async def kube(tmp_path):
    fake = FakeApiServer()
    server = TestServer(fake.app())
    await server.start_server()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""
apiVersion: v1
kind: Config
current-context: test
clusters:
- name: c
  cluster: {{server: "{server.make_url('')}"}}
users:
- name: u
  user: {{token: t0ken}}
contexts:
- name: test
  context: {{cluster: c, user: u, namespace: serving}}
""")
    yield fake, kubeconfig
    fake.end_watches()
    await server.close()


def worker_slices(kubeconfig: Path) -> KubernetesDiscovery:
    return KubernetesDiscovery(KubeApi.from_kubeconfig(kubeconfig), "serving",
                               "frota.dev/role=worker", port_name="http")


@contextlib.asynccontextmanager
async def watching(fake: FakeApiServer, kubeconfig: Path) -> AsyncIterator[list[list[str]]]:
    """Discovery of the worker slices, running: yields the URL lists it reports (as they
    come), once its first watch is open; stops it on the way out."""
    seen: list[list[str]] = []
    discovery = worker_slices(kubeconfig)
    async with aiohttp.ClientSession() as session:
        await discovery.start(session, seen.append)
        try:
            await wait_until(lambda: bool(fake.watches))
            yield seen
        finally:
            await discovery.stop()


async def test_kubernetes_discovery_lists_then_follows_the_watch(kube):
    fake, kubeconfig = kube
    fake.items["s1"] = endpoint_slice("s1", {"10.0.0.1": True, "10.0.0.2": False}, "1")
    async with watching(fake, kubeconfig) as seen:
        assert seen == [["http://10.0.0.1:8000"]]
        # The second endpoint becomes ready, a new slice appears, then the first goes away.
        fake.emit("MODIFIED", endpoint_slice("s1", {"10.0.0.1": True, "10.0.0.2": True}, ""))
        await wait_until(lambda: len(seen) == 2)
        assert seen[-1] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        fake.emit("ADDED", endpoint_slice("s2", {"10.0.1.1": True}, ""))
        await wait_until(lambda: len(seen) == 3)
        fake.emit("DELETED", endpoint_slice("s1", {}, ""))
        await wait_until(lambda: seen[-1] == ["http://10.0.1.1:8000"])
        # A bookmark changes nothing but the resourceVersion.
        fake.resource_version += 1
        fake.watches[0].put_nowait({"type": "BOOKMARK", "object": {
            "metadata": {"resourceVersion": str(fake.resource_version)}}})
        # The server ends the watch (timeout): the client watches again from where it was.
        fake.end_watches()
        await wait_until(lambda: bool(fake.watches))
        assert fake.requests[-1]["resourceVersion"] == str(fake.resource_version)
        assert sum(r.get("watch") != "1" for r in fake.requests) == 1  # no re-list


async def test_kubernetes_discovery_relists_on_410_gone(kube):
    fake, kubeconfig = kube
    fake.items["s1"] = endpoint_slice("s1", {"10.0.0.1": True}, "1")
    fake.expire_next_watch = True
    async with watching(fake, kubeconfig) as seen:
        assert sum(r.get("watch") != "1" for r in fake.requests) == 2  # listed twice
        fake.emit("ADDED", endpoint_slice("s2", {"10.0.0.9": True}, ""))
        await wait_until(lambda: len(seen) == 2)
        assert seen[-1] == ["http://10.0.0.1:8000", "http://10.0.0.9:8000"]


async def test_the_router_follows_endpointslices_without_restart(kube, start_worker):
    from frota.router.app import RouterConfig, build_app

    fake, kubeconfig = kube
    a, b = await start_worker(name="a"), await start_worker(name="b")

    def slice_of(worker, name):
        host, port = worker.url.removeprefix("http://").split(":")
        return endpoint_slice(name, {host: True}, "", port=int(port))

    app = build_app(RouterConfig(probe_interval=0.05), worker_slices(kubeconfig))
    await app.start("127.0.0.1", 0)
    pool = app.router.pool
    try:
        await wait_until(lambda: bool(fake.watches))
        fake.emit("ADDED", slice_of(a, "sa"))
        await wait_until(lambda: [w.url for w in pool.healthy()] == [a.url])
        fake.emit("ADDED", slice_of(b, "sb"))
        await wait_until(lambda: len(pool.healthy()) == 2)
        fake.emit("DELETED", slice_of(a, "sa"))
        await wait_until(lambda: [w.url for w in pool.healthy()] == [b.url])
    finally:
        await app.stop()


def test_in_cluster_config_reads_the_service_account(tmp_path, monkeypatch):
    import ssl
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=test", "-keyout", str(tmp_path / "key"),
                    "-out", str(tmp_path / "ca.crt")], check=True, capture_output=True)
    (tmp_path / "token").write_text("tok1\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = KubeApi.in_cluster(tmp_path)
    assert api.server == "https://10.96.0.1:443"
    assert isinstance(api.ssl_context, ssl.SSLContext)
    assert api.headers()["Authorization"] == "Bearer tok1"
    (tmp_path / "token").write_text("tok2")  # rotated by the kubelet
    assert api.headers()["Authorization"] == "Bearer tok2"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(RuntimeError, match="kubeconfig"):
        KubeApi.in_cluster(tmp_path)


def test_kubeconfig_with_embedded_ca_and_client_certificate(tmp_path):
    import base64
    import ssl
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=test", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)

    def b64(name: str) -> str:
        return base64.b64encode((tmp_path / name).read_bytes()).decode()

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(f"""
current-context: kind
clusters:
- name: kind
  cluster: {{server: "https://127.0.0.1:6443", certificate-authority-data: {b64("cert.pem")}}}
users:
- name: admin
  user: {{client-certificate-data: {b64("cert.pem")}, client-key-data: {b64("key.pem")}}}
contexts:
- name: kind
  context: {{cluster: kind, user: admin}}
""")
    api = KubeApi.from_kubeconfig(kubeconfig)
    assert api.server == "https://127.0.0.1:6443"
    assert isinstance(api.ssl_context, ssl.SSLContext)
    assert "Authorization" not in api.headers()
    assert not any(Path(p).exists() for p in api._tempfiles)  # key material not left behind
