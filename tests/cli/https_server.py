"""A real HTTPS server on a free loopback port, with a CA made for the test (the `openssl`
command): what `frota fetch` and the worker's runtime loads download from.

`Files` maps a URL path to what is served there: bytes (200), `Truncated(body, length)`
(a Content-Length larger than the body, then the connection closes), or `Stalled(body,
length)` (the same, but the connection stays open until the client closes it: a download
under way). Any other path is 404.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import shutil
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Truncated:
    body: bytes
    length: int


@dataclass(frozen=True)
class Stalled:
    body: bytes
    length: int


Files = dict[str, "bytes | Truncated | Stalled"]


@dataclass(frozen=True)
class LocalCA:
    ca_cert: Path  # what SSL_CERT_FILE names to trust the server
    server_cert: Path
    server_key: Path


def make_ca(directory: Path) -> LocalCA:
    """A CA and a certificate it signs for 127.0.0.1 and localhost (EC keys: fast to make)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test CA")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "server.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for cmd in (
        ["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca_cert, "-days", "2",
         "-subj", "/CN=frota test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
        ["openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
         "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext],
    ):
        subprocess.run([str(c) for c in cmd], check=True, capture_output=True, timeout=60)
    return LocalCA(ca_cert, cert, key)


def _handler(files: Files) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = files.get(self.path.split("?", 1)[0])
            if found is None:
                self.send_error(404)
                return
            body, length = ((found.body, found.length) if isinstance(found, Truncated | Stalled)
                            else (found, len(found)))
            self.send_response(200)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(body)
            if isinstance(found, Stalled):
                self.wfile.flush()
                with contextlib.suppress(OSError):
                    self.rfile.read(1)  # returns once the client has gone
            if isinstance(found, Truncated | Stalled):
                self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serving(ca: LocalCA, files: Files) -> Iterator[str]:
    """Serve `files` over HTTPS on 127.0.0.1; yield the base URL (https://127.0.0.1:PORT)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(files))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.server_cert, ca.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def tar_gz(members: dict[str, bytes]) -> bytes:
    """A .tar.gz of regular files, by name (names are taken as given, `..` included)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()

