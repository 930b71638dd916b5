"""The operator against an emulated Kubernetes API (kmock), with a fake kubelet.

`FakeApiserver` adds to kmock's in-memory emulator the few apiserver
behaviours the operator relies on: uids, generations that move with the
spec, resourceVersions, server-side apply creating missing objects,
generateName, and garbage collection through owner references. `Cluster`
plays the controllers the operator leaves work to: it turns StatefulSets
into rank pods and marks router Deployments ready, when a test says so.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import jsonpatch
import kmock
import kopf
import pytest
import yaml

from frota.operator.loop import handlers
from frota.operator.loop.state import OperatorState
from frota.operator.settings import OperatorSettings

NAMESPACE = "default"
ISVC_PATH = f"/apis/frota.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices"
RESOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "frota.dev/v1alpha1/inferenceservices": ("InferenceService", ("status", "scale")),
    "apps/v1/statefulsets": ("StatefulSet", ("status",)),
    "apps/v1/deployments": ("Deployment", ("status",)),
    "v1/services": ("Service", ()),
    "v1/configmaps": ("ConfigMap", ()),
    "v1/secrets": ("Secret", ()),
    "v1/serviceaccounts": ("ServiceAccount", ()),
    "v1/pods": ("Pod", ("status",)),
    "v1/events": ("Event", ()),
    "rbac.authorization.k8s.io/v1/roles": ("Role", ()),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", ()),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", ()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", ()),
    "discovery.k8s.io/v1/endpointslices": ("EndpointSlice", ()),
}
VERBS = ("get", "list", "watch", "create", "patch", "update", "delete")
PATHS = {
    kind: (f"/api/{res.split('/')[0]}" if res.startswith("v1/") else f"/apis/{res.rsplit('/', 1)[0]}",
           res.rsplit("/", 1)[1])
    for res, (kind, _) in RESOURCES.items()
}
_versions = itertools.count(1)


@attrs.define(kw_only=True)
class FakeApiserver(kmock.KubernetesEmulator):
    """kmock's emulator plus the apiserver behaviours the operator depends on."""

    writes: list[tuple[str, str]] = attrs.field(factory=list)
    failures: list[list[Any]] = attrs.field(factory=list)  # [method, path part, status, times]

    def fail(self, method: str, path_part: str, status: int, times: int) -> None:
        """Answer the next `times` matching requests with an error (nothing is stored)."""
        self.failures.append([method.upper(), path_part, status, times])

    async def _handle(self, request: kmock.Request) -> Any:
        for failure in self.failures:
            method, part, status, times = failure
            if times > 0 and request.method.upper() == method and part in request.url.path:
                failure[3] -= 1
                return aiohttp.web.json_response(
                    {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": status,
                     "reason": "Injected", "message": f"injected {status}"}, status=status)
        writing = request.method.upper() in ("POST", "PATCH", "PUT", "DELETE")
        if writing:
            self.writes.append((request.method.upper(), request.url.path))
        if request.resource is not None and isinstance(request.data, dict):
            request = await self._prepare(request)
        try:
            response = await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:  # the apiserver answers 422, not 500
            return aiohttp.web.json_response(
                {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 422,
                 "reason": "Invalid", "message": str(exc)}, status=422)
        if request.resource is not None and writing:
            # A DELETE, or a PATCH that drops an owner's last finalizer, may remove an owner.
            await self._collect_garbage()
        return response

    async def _prepare(self, request: kmock.Request) -> kmock.Request:
        data: dict[str, Any] = request.data
        meta = data.setdefault("metadata", {})
        if request.action == kmock.action.UPDATE and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            exists = key in self.objects and not self.objects[key].deleted
            is_apply = "apply-patch" in request.headers.get("Content-Type", "")
            if not exists and is_apply:  # server-side apply creates what is missing
                _stamp_new(meta, request.namespace)
                async with self._lock:
                    if key in self.objects:
                        self.objects[key].create(data)
                    else:
                        self.objects[key] = data
                    raw = self.objects[key].raw
                    await self._buses[request.resource].put({"type": "ADDED", "object": raw})
            elif exists:
                old = self.objects[key]
                if "spec" in data and request.subresource in (None, "scale") and (
                    _merged(old.get("spec") or {}, data["spec"]) != old.get("spec")
                ):
                    meta["generation"] = int(old.get("metadata", {}).get("generation", 1)) + 1
        if request.action == kmock.action.CREATE:
            _stamp_new(meta, request.namespace)
        meta["resourceVersion"] = str(next(_versions))
        if not meta:
            data.pop("metadata")
        return request

    async def _collect_garbage(self) -> None:
        """Delete objects whose owners are all gone (the garbage collector's job)."""
        while True:
            live_uids = {
                o.get("metadata", {}).get("uid")
                for o in self.objects.values() if not o.deleted
            }
            orphans = [
                (key, obj) for key, obj in self.objects.items()
                if not obj.deleted and (refs := obj.get("metadata", {}).get("ownerReferences"))
                and not any(r.get("uid") in live_uids for r in refs)
            ]
            if not orphans:
                return
            async with self._lock:
                for (resource, _, _), obj in orphans:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})


def _stamp_new(meta: dict[str, Any], namespace: str | None) -> None:
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("generation", 1)
    meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
    meta.setdefault("namespace", namespace)
    meta["resourceVersion"] = str(next(_versions))


def _merged(old: dict, patch: dict) -> dict:
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merged(out[k], v)
        else:
            out[k] = v
    return out


class Cluster:
    """A client of the fake apiserver, plus the controllers the operator relies on."""

    def __init__(self, server: FakeApiserver, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session
        self.endpoints_lag = False  # True: the EndpointSlice controller falls behind

    # -- plain API calls ------------------------------------------------------

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/merge-patch+json") -> dict:
        async with self.session.request(
            method, path, json=body, headers={"Content-Type": content_type}
        ) as resp:
            data = await resp.json(content_type=None)
            assert resp.status < 300, f"{method} {path}: {resp.status} {data}"
            return data

    def objects(self, kind: str) -> list[dict]:
        """Live objects of a kind, from the emulator's memory."""
        plural = PATHS[kind][1]
        return [
            dict(obj.raw) for (res, _, _), obj in self.server.objects.items()
            if res.plural == plural and not obj.deleted
        ]

    def get(self, kind: str, name: str) -> dict | None:
        return next((o for o in self.objects(kind) if o["metadata"]["name"] == name), None)

    def names(self, kind: str) -> set[str]:
        return {o["metadata"]["name"] for o in self.objects(kind)}

    def path(self, kind: str, name: str | None = None) -> str:
        root, plural = PATHS[kind]
        base = f"{root}/namespaces/{NAMESPACE}/{plural}"
        return f"{base}/{name}" if name else base

    async def create_isvc(self, manifest: dict) -> dict:
        return await self.call("POST", ISVC_PATH, manifest, "application/json")

    async def create_disaggregated(self, replicas: int = 1, prefill: int = 1,
                                   decode: int = 1) -> dict:
        """Create `pd`: `replicas` units of `prefill` prefill and `decode` decode groups."""
        return await self.create_isvc(sample("pd", replicas=replicas, disaggregation={
            "prefill": {"replicas": prefill}, "decode": {"replicas": decode}}))

    async def patch_isvc(self, name: str, patch: dict, subresource: str = "") -> dict:
        path = f"{ISVC_PATH}/{name}" + (f"/{subresource}" if subresource else "")
        return await self.call("PATCH", path, patch)

    async def delete(self, kind: str, name: str) -> None:
        await self.call("DELETE", self.path(kind, name))

    def isvc(self, name: str) -> dict:
        found = self.get("InferenceService", name)
        assert found is not None, f"no InferenceService {name}"
        return found

    def condition(self, name: str, type_: str) -> dict | None:
        for cond in (self.isvc(name).get("status") or {}).get("conditions") or []:
            if cond["type"] == type_:
                return cond
        return None

    def events(self, reason: str | None = None) -> list[dict]:
        return [e for e in self.objects("Event") if reason is None or e.get("reason") == reason]

    # -- the controllers the operator leaves work to --------------------------

    async def run_pods(self, sts_name: str, *, ready: bool = True, restarts: int = 0) -> None:
        """Be the StatefulSet controller and kubelet for one group: pods from the current template."""
        sts = self.get("StatefulSet", sts_name)
        assert sts is not None, f"no StatefulSet {sts_name}"
        template = sts["spec"]["template"]
        for rank in range(sts["spec"]["replicas"]):
            name = f"{sts_name}-{rank}"
            labels = {**template["metadata"]["labels"], "apps.kubernetes.io/pod-index": str(rank)}
            if self.get("Pod", name) is None:
                await self.call("POST", self.path("Pod"), {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                                 "ownerReferences": [{
                                     "apiVersion": "apps/v1", "kind": "StatefulSet",
                                     "name": sts_name, "uid": sts["metadata"]["uid"],
                                     "controller": True}]},
                    "spec": template["spec"],
                }, "application/json")
            await self.set_pod(name, ready=ready, restarts=restarts)

    async def set_pod(self, name: str, *, ready: bool = True, restarts: int = 0,
                      phase: str = "Running", waiting: str | None = None) -> None:
        """Be the kubelet for one pod; ``waiting`` is the reason its container waits, if it does."""
        container: dict = {"name": "worker", "restartCount": restarts, "ready": ready,
                           "image": self.get("Pod", name)["spec"]["containers"][0]["image"]}
        if waiting:
            container["state"] = {"waiting": {"reason": waiting, "message": f"{waiting}: no such image"}}
        status = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [container],
        }
        await self.call("PATCH", self.path("Pod", name) + "/status", {"status": status})
        if not self.endpoints_lag:
            await self.sync_endpoints()

    async def sync_endpoints(self) -> None:
        """Be the EndpointSlice controller for the Services the router reads."""
        pods = [p for p in self.objects("Pod") if not p["metadata"].get("deletionTimestamp")]
        for svc in self.objects("Service"):
            labels = svc["metadata"].get("labels") or {}
            if labels.get("frota.dev/serving") != "true":
                continue
            selector = svc["spec"].get("selector") or {}
            endpoints = [
                {"targetRef": {"kind": "Pod", "name": p["metadata"]["name"]},
                 "conditions": {"ready": any(c.get("type") == "Ready" and c.get("status") == "True"
                                             for c in (p.get("status") or {}).get("conditions", []))}}
                for p in pods
                if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
            ]
            name = svc["metadata"]["name"]
            await self.call("PATCH", self.path("EndpointSlice", f"{name}-fake"), {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": f"{name}-fake", "namespace": NAMESPACE,
                             "labels": {**labels, "kubernetes.io/service-name": name}},
                "addressType": "IPv4", "endpoints": endpoints,
            }, "application/apply-patch+yaml")

    async def run_router(self, name: str) -> None:
        """Be the Deployment controller: the router's pods are all ready."""
        dep = self.get("Deployment", name)
        assert dep is not None, f"no Deployment {name}"
        replicas = dep["spec"].get("replicas", 1)
        await self.call("PATCH", self.path("Deployment", name) + "/status",
                        {"status": {"replicas": replicas, "readyReplicas": replicas}})

    async def run_everything(self, isvc: str) -> None:
        """All groups that exist run ready pods of their current template; the router is up."""
        for sts in self.objects("StatefulSet"):
            if sts["metadata"]["labels"].get("app.kubernetes.io/instance") == isvc:
                await self.run_pods(sts["metadata"]["name"])
        await self.run_router(f"{isvc}-router")


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll a condition until it holds (no fixed sleeps in tests)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            result = predicate()
        except (AssertionError, KeyError, TypeError):
            result = None
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(0.02)


def sample(name: str = "tiny", **spec: Any) -> dict:
    """A small valid InferenceService (SmolLM2 on CPU, one rank per group)."""
    manifest = yaml.safe_load(f"""
apiVersion: frota.dev/v1alpha1
kind: InferenceService
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  model: {{name: smollm2, uri: "alias:smollm2"}}
  engine: {{dtype: float32, maxModelLen: 2048}}
  resources: {{cpu: "2", memory: 3Gi}}
  replicas: 2
""")
    manifest["spec"].update(spec)
    return manifest


# Quick enough for tests: the autoscaler and the capacity timer tick twice a second,
# retries wait a fifth of one.
SETTINGS = OperatorSettings(namespaces=(NAMESPACE,), autoscale_interval_seconds=0.5,
                            capacity_report_interval_seconds=0.5, retry_delay_seconds=0.2,
                            fleet_key_check_seconds=0.5)


class Operator:
    """One operator process: kopf in its own thread and event loop, as `kopf run` would be.

    A thread keeps kopf's shutdown (which waits for every task of its loop)
    away from the test's loop, where the fake apiserver serves. It logs in to
    the fake apiserver through the operator's own login handler.
    """

    def __init__(self, server: FakeApiserver) -> None:
        self.server = server
        url = str(server.url).rstrip("/")
        self.state = OperatorState(SETTINGS, login=lambda _: kopf.ConnectionInfo(server=url))
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kopf", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        settings = kopf.OperatorSettings()
        settings.scanning.disabled = True
        settings.watching.reconnect_backoff = 0.1
        settings.queueing.idle_timeout = 0.05
        await kopf.operator(
            registry=handlers.registry(SETTINGS), standalone=True, clusterwide=False,
            namespaces=list(SETTINGS.namespaces), settings=settings,
            memo=kopf.Memo(state=self.state), stop_flag=self.stop_flag,
            ready_flag=self.ready_flag,
        )

    async def start(self) -> None:
        self.thread.start()
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, self.ready_flag.wait, 10), "kopf did not start"

    def metric(self, sample: str, /, **labels: str) -> float:
        """One sample of the operator's metrics (0 until it is first counted)."""
        return self.state.metrics.registry.get_sample_value(sample, labels) or 0.0

    async def stop(self) -> None:
        self.stop_flag.set()
        await asyncio.get_running_loop().run_in_executor(None, self.thread.join, 15)
        assert not self.thread.is_alive(), "kopf did not stop"

    async def __aenter__(self) -> Operator:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiserver]:
    server = FakeApiserver()
    for resource, (kind, subresources) in RESOURCES.items():
        server.resources[resource] = kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs=set(VERBS), subresources=set(subresources)
        )
    # kopf waits for these two to be discoverable before it starts watching.
    server.resources["v1/namespaces"] = kmock.ResourceInfo(
        kind="Namespace", namespaced=False, verbs=set(VERBS))
    server.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs=set(VERBS))
    async with server, kmock.Server(server):
        yield server


@pytest.fixture
async def cluster(apiserver: FakeApiserver) -> AsyncIterator[Cluster]:
    async with aiohttp.ClientSession(base_url=str(apiserver.url)) as session:
        yield Cluster(apiserver, session)


@pytest.fixture
async def operator(apiserver: FakeApiserver) -> AsyncIterator[Operator]:
    async with Operator(apiserver) as op:
        yield op
