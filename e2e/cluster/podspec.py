"""Turn parts of a Pod spec into what a local process needs: env, volumes.

Pure helpers plus the few API reads they need (ConfigMaps, Secrets,
TokenRequests); used by :mod:`e2e.cluster.podrunner`.
"""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path
from typing import Any

from e2e.cluster.kubeapi import KubeClient

_SUFFIX = {
    "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def parse_quantity(q: str | int | float) -> float:
    """A Kubernetes quantity ("500m", "2Gi", "1e3") as a number."""
    s = str(q).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * _SUFFIX[suffix]
    return float(s)


def expand(value: str, env: dict[str, str]) -> str:
    """Expand ``$(VAR)`` references as the kubelet does (``$$`` escapes)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR_REF.sub(sub, value)


def field_ref(pod: dict[str, Any], path: str) -> str:
    """Resolve a downward-API ``fieldPath`` against the pod."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs", [])),
        "status.hostIPs": ",".join(p["ip"] for p in status.get("hostIPs", [])),
    }
    if path in simple:
        return str(simple[path] or "")
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1], {})
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ValueError(f"unsupported fieldPath {path!r}")


def resource_ref(container: dict[str, Any], ref: dict[str, Any], node_cpu: str) -> str:
    """Resolve a ``resourceFieldRef`` (limits fall back to node capacity like the kubelet)."""
    kind, _, name = ref["resource"].partition(".")
    resources = container.get("resources", {})
    value = resources.get(kind, {}).get(name)
    if value is None and kind == "limits":
        value = node_cpu if name == "cpu" else "0"
    divisor = parse_quantity(ref.get("divisor", "1"))
    return str(math.ceil(parse_quantity(value or "0") / divisor))


def _data(obj: dict[str, Any], secret: bool) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for k, v in (obj.get("data") or {}).items():
        out[k] = base64.b64decode(v) if secret else v.encode()
    for k, v in (obj.get("binaryData") or {}).items():
        out[k] = base64.b64decode(v)
    for k, v in (obj.get("stringData") or {}).items():
        out[k] = v.encode()
    return out


def read_source(api: KubeClient, ns: str, kind: str, name: str) -> dict[str, bytes]:
    """The data of a ConfigMap (``kind="configmaps"``) or Secret (``"secrets"``)."""
    obj = api.get(f"/api/v1/namespaces/{ns}/{kind}/{name}")
    return _data(obj, secret=kind == "secrets")


def container_env(
    api: KubeClient, pod: dict[str, Any], container: dict[str, Any],
    base: dict[str, str], node_cpu: str,
) -> dict[str, str]:
    """The container's environment: base, envFrom, then env (with ``$(VAR)``)."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in container.get("envFrom", []):
        prefix = src.get("prefix", "")
        for key, kind in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            if key in src:
                try:
                    data = read_source(api, ns, kind, src[key]["name"])
                except Exception:
                    if src[key].get("optional"):
                        continue
                    raise
                env.update({prefix + k: v.decode() for k, v in data.items()})
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = expand(var["value"], env)
            continue
        vf = var.get("valueFrom", {})
        if "fieldRef" in vf:
            env[name] = field_ref(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = resource_ref(container, vf["resourceFieldRef"], node_cpu)
        else:
            for key, kind in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
                if key in vf:
                    ref = vf[key]
                    try:
                        env[name] = read_source(api, ns, kind, ref["name"])[ref["key"]].decode()
                    except Exception:
                        if not ref.get("optional"):
                            raise
        if name not in env:
            env[name] = ""
    return env


def _write(root: Path, rel: str, content: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def _write_items(root: Path, data: dict[str, bytes], items: list[dict[str, Any]] | None) -> None:
    if items:
        for item in items:
            if item["key"] in data:
                _write(root, item["path"], data[item["key"]])
    else:
        for key, content in data.items():
            _write(root, key, content)


def _token(api: KubeClient, pod: dict[str, Any], src: dict[str, Any]) -> bytes:
    meta = pod["metadata"]
    sa = pod["spec"].get("serviceAccountName") or "default"
    spec: dict[str, Any] = {
        "expirationSeconds": src.get("expirationSeconds", 3607),
        "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"],
        },
    }
    if src.get("audience"):
        spec["audiences"] = [src["audience"]]
    resp = api.post(
        f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return resp["status"]["token"].encode()


def materialize_volume(
    api: KubeClient, pod: dict[str, Any], vol: dict[str, Any], root: Path
) -> Path:
    """Write one volume's files under ``root`` (or return a host path); the source to mount."""
    ns = pod["metadata"]["namespace"]
    root.mkdir(parents=True, exist_ok=True)
    if "hostPath" in vol:
        path = Path(vol["hostPath"]["path"])
        if vol["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
            path.mkdir(parents=True, exist_ok=True)
        return path
    if "emptyDir" in vol:
        return root
    for key, kind in (("configMap", "configmaps"), ("secret", "secrets")):
        if key in vol:
            src = vol[key]
            name = src.get("name") or src.get("secretName")
            try:
                data = read_source(api, ns, kind, name)
            except Exception:
                if src.get("optional"):
                    return root
                raise
            _write_items(root, data, src.get("items"))
            return root
    if "downwardAPI" in vol:
        for item in vol["downwardAPI"].get("items", []):
            if "fieldRef" in item:
                _write(root, item["path"], field_ref(pod, item["fieldRef"]["fieldPath"]).encode())
        return root
    if "projected" in vol:
        for src in vol["projected"].get("sources", []):
            if "serviceAccountToken" in src:
                _write(root, src["serviceAccountToken"]["path"], _token(api, pod, src["serviceAccountToken"]))
            elif "configMap" in src or "secret" in src:
                key = "configMap" if "configMap" in src else "secret"
                kind = "configmaps" if key == "configMap" else "secrets"
                try:
                    data = read_source(api, ns, kind, src[key]["name"])
                except Exception:
                    if src[key].get("optional"):
                        continue
                    raise
                _write_items(root, data, src[key].get("items"))
            elif "downwardAPI" in src:
                for item in src["downwardAPI"].get("items", []):
                    if "fieldRef" in item:
                        value = field_ref(pod, item["fieldRef"]["fieldPath"])
                        _write(root, item["path"], value.encode())
        return root
    raise ValueError(f"volume {vol.get('name')!r}: only emptyDir, hostPath, configMap, "
                     "secret, downwardAPI and projected volumes run on the local node agent")
