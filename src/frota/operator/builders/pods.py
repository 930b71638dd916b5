"""What every pod Frota runs shares: non-root and a read-only root (writes go to /tmp),
HTTP probes, and the grace its server drains requests in."""

from __future__ import annotations

from typing import Any

from frota.api import InferenceService

RUN_AS_USER = 10001
# SIGTERM to SIGKILL, for workers and routers alike: each drains its requests in flight
# for all but the last DRAIN_MARGIN_SECONDS (and the router's preStop wait) of it.
TERMINATION_GRACE_SECONDS = 60
DRAIN_MARGIN_SECONDS = 10
DRAIN_SECONDS = TERMINATION_GRACE_SECONDS - DRAIN_MARGIN_SECONDS  # a server's, after SIGTERM


def pod_security_context() -> dict[str, Any]:
    """Non-root, RuntimeDefault seccomp, volumes writable by the run-as group."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """No privilege escalation, no capabilities, read-only root (writes go to /tmp)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def frota_container(isvc: InferenceService, name: str, args: list[str], *,
                    env: list[dict[str, Any]], resources: dict[str, Any],
                    volume_mounts: list[dict[str, Any]],
                    ports: list[dict[str, Any]] | None = None,
                    message_from_log: bool = False) -> dict[str, Any]:
    """A container of the fleet's image that runs `frota ARGS` beside the server (an init
    container, the model-cache Job's), locked down like every container Frota runs.
    `message_from_log`: the last lines of its log become its termination message (the
    operator reads why it failed there)."""
    container: dict[str, Any] = {
        "name": name, "image": isvc.spec.engine.image,
        "imagePullPolicy": isvc.spec.engine.imagePullPolicy, "command": ["frota"], "args": args,
    }
    if ports:
        container["ports"] = ports
    container |= {"env": env, "resources": resources,
                  "securityContext": container_security_context()}
    if message_from_log:
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    container["volumeMounts"] = volume_mounts
    return container


def http_probe(path: str, *, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    """An HTTP GET probe on the container's `http` port."""
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def tmp_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """An emptyDir for /tmp (the root filesystem is read-only)."""
    return {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}, {"name": "tmp", "mountPath": "/tmp"}


# HOME and caches point into /tmp so libraries that write there work on a read-only root.
WRITABLE_HOME_ENV = [
    {"name": "HOME", "value": "/tmp"},
    {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
]
