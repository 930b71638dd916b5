"""Run one Pod as local processes: the node agent's per-pod worker thread.

Lifecycle: network namespace -> volumes -> init containers in order -> the
containers, restarted per ``restartPolicy`` with back-off, probed per their
startup/readiness/liveness probes -> status patched to the apiserver on every
change -> on deletion SIGTERM, grace period, SIGKILL, then the pod object is
removed (the kubelet's part of graceful deletion).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from frota.engine.kernels import cache_root

from e2e.cluster import netns
from e2e.cluster.kubeapi import ApiError
from e2e.cluster.podspec import container_env, expand, materialize_volume

if TYPE_CHECKING:
    from e2e.cluster.agent import NodeAgent

log = logging.getLogger("frota.e2e.agent")
REPO = Path(__file__).resolve().parents[2]
TICK_S = 0.25
MAX_BACKOFF_S = 20.0
# Mount points podinit had to create on the host, removed when the cluster stops.
MOUNTPOINTS_FILE = "created-mountpoints"


def now() -> str:
    """The current time in the apiserver's RFC 3339 form."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class ProbeState:
    """Counters of one probe of one container."""

    next_at: float = 0.0
    successes: int = 0
    failures: int = 0


@dataclass
class Container:
    """A container of the pod and its running process."""

    spec: dict[str, Any]
    is_init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    restart_count: int = 0
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    done: bool = False  # terminated and will not restart
    restart_at: float | None = None
    backoff_s: float = 1.0
    started_mono: float = 0.0
    probes: dict[str, ProbeState] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def is_sidecar(self) -> bool:
        return self.is_init and self.spec.get("restartPolicy") == "Always"


class PodRunner(threading.Thread):
    """Owns one pod bound to one of the agent's nodes."""

    def __init__(self, agent: NodeAgent, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.agent = agent
        self.api = agent.api
        self.pod = pod
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.dir = agent.work_dir / f"{self.ns}_{self.pod_name}_{self.uid[:8]}"
        self.netns_name = ""
        self.ip = ""
        self.index = 0
        self.delete_grace: float | None = None
        self.gone = threading.Event()  # the pod object vanished: stop at once
        self.init: list[Container] = [Container(c, is_init=True) for c in pod["spec"].get("initContainers", [])]
        self.main: list[Container] = [Container(c) for c in pod["spec"]["containers"]]
        self.mounts: dict[str, Path] = {}
        self.initialized = not self.init
        self.phase = "Pending"
        self.start_time = now()
        self.conditions: dict[str, dict[str, str]] = {}
        self.last_status: dict[str, Any] | None = None
        self.reason: str | None = None
        self.message: str | None = None

    # --- called from the agent's watch thread ------------------------------

    def update(self, pod: dict[str, Any]) -> None:
        """Take a newer version of the pod object (deletion shows up here)."""
        self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and self.delete_grace is None:
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            self.delete_grace = float(grace)

    # --- the thread --------------------------------------------------------

    def run(self) -> None:
        try:
            self._setup()
            self._loop()
        except Exception as exc:
            log.exception("pod %s/%s failed in the agent", self.ns, self.pod_name)
            self.phase, self.reason, self.message = "Failed", "AgentError", str(exc)
            with contextlib.suppress(Exception):
                self._push_status()
            while not self.gone.is_set() and self.delete_grace is None and not self.agent.stopping.is_set():
                time.sleep(TICK_S)
        finally:
            self._kill_all(grace=0 if self.gone.is_set() else min(self.delete_grace or 5.0, 30.0))
            self._teardown_network()
            if self.delete_grace is not None and not self.gone.is_set() and not self.agent.stopping.is_set():
                self._finalize_delete()
            self.agent.runner_done(self)

    def _setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = self.agent.allocate_index()
        self.netns_name, self.ip = netns.create_pod_netns(self.index, self.agent.hosts_for(self))
        self._set_condition("PodReadyToStartContainers", True)
        self._set_condition("Initialized", self.initialized)
        self._set_condition("ContainersReady", False)
        self._set_condition("Ready", False)
        self._push_status()
        for vol in self.pod["spec"].get("volumes", []):
            self.mounts[vol["name"]] = materialize_volume(
                self.api, self._pod_with_ip(), vol, self.dir / "volumes" / vol["name"]
            )

    def _loop(self) -> None:
        while True:
            if self.gone.is_set() or self.agent.stopping.is_set() or self.delete_grace is not None:
                return
            if not self.initialized:
                self._step_init()
            else:
                for c in self.main + [c for c in self.init if c.is_sidecar]:
                    self._step_container(c, self._policy())
                self._update_phase()
            netns.write_hosts(self.netns_name, self.agent.hosts_for(self))
            self._push_status()
            time.sleep(TICK_S)

    def _policy(self) -> str:
        return self.pod["spec"].get("restartPolicy", "Always")

    def _step_init(self) -> None:
        for c in self.init:
            if c.is_sidecar:
                self._step_container(c, "Always")
                if not c.started:
                    return
                continue
            if not c.done:
                self._step_container(c, "Never" if self._policy() == "Never" else "OnFailure")
            if not c.done:
                return
            if c.state["terminated"]["exitCode"] != 0:
                self.phase, self.reason = "Failed", "InitContainerFailed"
                return
        self.initialized = True
        self._set_condition("Initialized", True)

    def _step_container(self, c: Container, policy: str) -> None:
        if c.done:
            return
        if c.proc is None:
            if c.restart_at is None or time.monotonic() >= c.restart_at:
                self._start(c)
            return
        code = c.proc.poll()
        if code is None:
            self._probe_all(c)
            return
        finished = now()
        c.state = {"terminated": {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": c.state.get("running", {}).get("startedAt", finished),
            "finishedAt": finished,
            "containerID": self._container_id(c),
        }}
        if code < 0:
            c.state["terminated"]["signal"] = -code
        c.proc, c.ready, c.started = None, False, False
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if not restart:
            c.done = True
            return
        if time.monotonic() - c.started_mono > 600:
            c.backoff_s = 1.0
        c.last_state = c.state
        c.state = {"waiting": {"reason": "CrashLoopBackOff",
                               "message": f"back-off {c.backoff_s:.0f}s restarting failed container"}}
        c.restart_at = time.monotonic() + c.backoff_s
        c.backoff_s = min(c.backoff_s * 2, MAX_BACKOFF_S)
        c.restart_count += 1

    def _update_phase(self) -> None:
        if self.phase in ("Succeeded", "Failed"):
            return
        cs = self.main
        if all(c.done for c in cs):
            ok = all(c.state["terminated"]["exitCode"] == 0 for c in cs)
            self.phase = "Succeeded" if ok else "Failed"
            for c in self.init:
                if c.is_sidecar and c.proc is not None:
                    self._signal(c, signal.SIGTERM)
        elif any(c.proc is not None or c.restart_at is not None or c.done for c in cs):
            self.phase = "Running"
        ready = self.phase == "Running" and all(
            c.ready for c in cs + [c for c in self.init if c.is_sidecar]
        )
        self._set_condition("ContainersReady", ready)
        self._set_condition("Ready", ready)

    # --- processes -----------------------------------------------------------

    def _start(self, c: Container) -> None:
        spec = c.spec
        try:
            c.env = container_env(
                self.api, self._pod_with_ip(), spec, self._base_env(c), self.agent.node_cpu
            )
        except Exception as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.restart_at = time.monotonic() + 2.0
            return
        command = spec.get("command") or self.agent.default_entrypoint
        argv = [expand(a, c.env) for a in [*command, *spec.get("args", [])]]
        mounts = []
        for m in spec.get("volumeMounts", []):
            hidden = [p for p in self.agent.must_stay_visible
                      if (p + "/").startswith(m["mountPath"].rstrip("/") + "/")]
            if hidden:
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": (
                    f"mountPath {m['mountPath']} would hide {hidden[0]}, which the local node "
                    "agent runs containers from; choose another mountPath")}}
                c.restart_at = time.monotonic() + 5.0
                return
            src = self.mounts[m["name"]]
            if m.get("subPath"):
                src = src / m["subPath"]
                if not src.exists():
                    src.mkdir(parents=True)
            mounts.append([str(src), m["mountPath"], bool(m.get("readOnly"))])
        shim = {
            "hostname": self.pod["spec"].get("hostname") or self.pod_name,
            "mounts": mounts, "cwd": spec.get("workingDir", ""), "scratch": str(self.dir),
            "record": str(self.agent.work_dir / MOUNTPOINTS_FILE),
            "env": c.env, "argv": argv,
        }
        shim_path = self.dir / f"{c.name}.json"
        shim_path.write_text(json.dumps(shim))
        logfile = (self.dir / f"{c.name}.log").open("ab")
        c.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns_name, "unshare", "--uts",
             sys.executable, "-m", "e2e.cluster.podinit", str(shim_path)],
            stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=str(self.dir),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)},
        )
        logfile.close()
        c.started_mono = time.monotonic()
        c.restart_at = None
        c.probes = {}
        c.state = {"running": {"startedAt": now()}}
        c.started = "startupProbe" not in spec
        c.ready = c.started and "readinessProbe" not in spec
        log.info("started %s/%s[%s] pid %d: %s", self.ns, self.pod_name, c.name, c.proc.pid, argv)

    def _base_env(self, c: Container) -> dict[str, str]:
        host, port = self.agent.apiserver_host, str(self.agent.apiserver_port)
        env = {
            "PATH": self.agent.container_path,
            "HOME": "/root",
            "HOSTNAME": self.pod["spec"].get("hostname") or self.pod_name,
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
            # The "image" here is this checkout's venv, whose C++ CPU kernels
            # scripts/bootstrap.sh built: like kernels baked into an image, every pod
            # reuses them instead of compiling its own copy under its private /tmp.
            "FROTA_KERNEL_CACHE": str(cache_root()),
        }
        gpus = self.agent.gpu_ids(self)
        if gpus is not None:
            env["NVIDIA_VISIBLE_DEVICES"] = gpus
        return env

    def _signal(self, c: Container, sig: int) -> None:
        if c.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, sig)

    def _kill_all(self, grace: float) -> None:
        containers = [c for c in self.main + self.init if c.proc is not None]
        for c in containers:
            self._signal(c, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(c.proc.poll() is None for c in containers if c.proc):
            time.sleep(0.1)
        for c in containers:
            self._signal(c, signal.SIGKILL)
            with contextlib.suppress(Exception):
                c.proc.wait(timeout=5)  # type: ignore[union-attr]

    def _teardown_network(self) -> None:
        if self.netns_name:
            netns.delete_pod_netns(self.netns_name)
            self.netns_name = ""
        if self.index:
            self.agent.release_index(self.index)
            self.index = 0

    def _finalize_delete(self) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid}}
        try:
            self.api.delete(f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}", body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("final delete of %s/%s: %s", self.ns, self.pod_name, exc)

    # --- probes --------------------------------------------------------------

    def _probe_all(self, c: Container) -> None:
        spec = c.spec
        if not c.started:
            result = self._run_probe(c, "startupProbe")
            if result is True:
                c.started = True
                c.ready = "readinessProbe" not in spec
            elif result is False:
                self._signal(c, signal.SIGKILL)
            return
        if "readinessProbe" in spec:
            result = self._run_probe(c, "readinessProbe")
            if result is not None:
                c.ready = result
        if self._run_probe(c, "livenessProbe") is False:
            log.info("liveness probe failed: restarting %s/%s[%s]", self.ns, self.pod_name, c.name)
            self._signal(c, signal.SIGTERM)

    def _run_probe(self, c: Container, kind: str) -> bool | None:
        """Run a due probe; return the thresholded verdict when it changes, else None."""
        probe = c.spec.get(kind)
        if not probe:
            return None
        st = c.probes.setdefault(
            kind, ProbeState(next_at=c.started_mono + probe.get("initialDelaySeconds", 0))
        )
        t = time.monotonic()
        if t < st.next_at:
            return None
        st.next_at = t + probe.get("periodSeconds", 10)
        ok = self._check(c, probe)
        if ok:
            st.successes, st.failures = st.successes + 1, 0
            if st.successes >= probe.get("successThreshold", 1):
                return True
        else:
            st.successes, st.failures = 0, st.failures + 1
            if st.failures >= probe.get("failureThreshold", 3):
                return False
        return None

    def _port(self, c: Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no container port named {port!r}")

    def _check(self, c: Container, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                h = probe["httpGet"]
                scheme = h.get("scheme", "HTTP").lower()
                url = f"{scheme}://{h.get('host') or self.ip}:{self._port(c, h['port'])}{h.get('path', '/')}"
                headers = {x["name"]: x["value"] for x in h.get("httpHeaders", [])}
                resp = httpx.get(url, timeout=timeout, headers=headers, verify=False)
                return 200 <= resp.status_code < 400
            if "tcpSocket" in probe or "grpc" in probe:
                port = (probe.get("tcpSocket") or probe.get("grpc"))["port"]
                with socket.create_connection((self.ip, self._port(c, port)), timeout=timeout):
                    return True
            if "exec" in probe and c.proc is not None:
                proc = subprocess.run(
                    ["nsenter", "-t", str(c.proc.pid), "-m", "-n", "-u", *probe["exec"]["command"]],
                    env=c.env, capture_output=True, timeout=max(timeout, 1.0),
                )
                return proc.returncode == 0
        except Exception:
            return False
        return False

    # --- status --------------------------------------------------------------

    def _pod_with_ip(self) -> dict[str, Any]:
        pod = json.loads(json.dumps(self.pod))
        status = pod.setdefault("status", {})
        status.update({"podIP": self.ip, "podIPs": [{"ip": self.ip}],
                       "hostIP": self.agent.host_ip, "hostIPs": [{"ip": self.agent.host_ip}]})
        return pod

    def _set_condition(self, kind: str, value: bool) -> None:
        status = "True" if value else "False"
        old = self.conditions.get(kind)
        if old is None or old["status"] != status:
            self.conditions[kind] = {"type": kind, "status": status, "lastTransitionTime": now()}

    def _container_id(self, c: Container) -> str:
        return f"frota://{self.uid}/{c.name}/{c.restart_count}"

    def _container_status(self, c: Container) -> dict[str, Any]:
        state = c.state
        if "running" in state:
            state = {"running": {"startedAt": state["running"]["startedAt"]}}
        out: dict[str, Any] = {
            "name": c.name, "image": c.spec.get("image", ""), "imageID": c.spec.get("image", ""),
            "ready": c.ready, "started": c.started, "restartCount": c.restart_count,
            "state": state, "lastState": c.last_state,
        }
        if c.proc is not None or "terminated" in c.state:
            out["containerID"] = self._container_id(c)
        return out

    def _push_status(self) -> None:
        status: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": self.agent.host_ip, "hostIPs": [{"ip": self.agent.host_ip}],
            "startTime": self.start_time,
            "conditions": [{"type": "PodScheduled", "status": "True"}, *self.conditions.values()],
            "containerStatuses": [self._container_status(c) for c in self.main],
        }
        if self.ip:
            status["podIP"], status["podIPs"] = self.ip, [{"ip": self.ip}]
        if self.init:
            status["initContainerStatuses"] = [self._container_status(c) for c in self.init]
        if self.reason:
            status["reason"], status["message"] = self.reason, self.message or self.reason
        if status == self.last_status:
            return
        try:
            self.api.merge_patch(
                f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}/status", {"status": status}
            )
            self.last_status = status
        except ApiError as exc:
            if exc.status == 404:
                self.gone.set()
            else:
                log.warning("status of %s/%s: %s", self.ns, self.pod_name, exc)
