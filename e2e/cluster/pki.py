"""A throwaway PKI for the local control plane, made with the openssl CLI.

One CA signs the apiserver's serving certificate and the admin client
certificate; a separate RSA key pair signs service-account tokens.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """Paths of the files :func:`make_pki` writes."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def kubelet_crt(self) -> Path:
        return self.dir / "kubelet.crt"

    @property
    def kubelet_key(self) -> Path:
        return self.dir / "kubelet.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _sign(pki: Pki, name: str, subject: str, ext: str) -> None:
    """Create ``name``.key and a CA-signed ``name``.crt with the given extensions."""
    d = pki.dir
    (d / f"{name}.ext").write_text(ext)
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=d)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=d)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "30", "-sha256", "-extfile", f"{name}.ext",
        "-out", f"{name}.crt", cwd=d,
    )


def make_pki(directory: Path, ips: list[str], dns_names: list[str]) -> Pki:
    """Write a CA, serving/client certificates and the service-account key pair.

    The node agent serves its log API with the kubelet certificate, which
    shares the apiserver's alternative names.

    ``ips`` and ``dns_names`` become the apiserver certificate's subject
    alternative names.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    if pki.sa_pub.exists():
        return pki
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-nodes", "-key", "ca.key", "-subj", "/CN=frota-e2e-ca",
        "-days", "30", "-sha256", "-out", "ca.crt", cwd=directory,
    )
    san = ",".join([f"IP:{ip}" for ip in ips] + [f"DNS:{n}" for n in dns_names])
    _sign(
        pki, "apiserver", "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n",
    )
    _sign(
        pki, "kubelet", "/CN=frota-e2e-node",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n",
    )
    _sign(
        pki, "admin", "/O=system:masters/CN=kubernetes-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return pki
