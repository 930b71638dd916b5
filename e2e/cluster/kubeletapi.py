"""The slice of the kubelet's HTTPS API that the apiserver proxies for ``kubectl logs``.

Serves ``GET /containerLogs/<ns>/<pod>/<container>`` (``tailLines``,
``follow``) from the log files the node agent writes, on the nodes'
InternalIP port 10250 with a CA-signed serving certificate.
"""

from __future__ import annotations

import http.server
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

LogLookup = Callable[[str, str, str], "tuple[Path, Callable[[], bool]] | None"]


def serve_logs(host: str, port: int, cert: Path, key: Path, lookup: LogLookup) -> http.server.ThreadingHTTPServer:
    """Start the log server in a daemon thread; ``lookup`` maps (ns, pod, container)
    to the log file and a callable saying whether the container may still write."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            parts = url.path.strip("/").split("/")
            found = lookup(*parts[1:4]) if len(parts) == 4 and parts[0] == "containerLogs" else None
            if found is None:
                self.send_error(404, "no such container on this node")
                return
            path, alive = found
            q = urllib.parse.parse_qs(url.query)
            data = path.read_bytes() if path.exists() else b""
            if "tailLines" in q:
                n = int(q["tailLines"][0])
                data = b"".join(data.splitlines(keepends=True)[-n:]) if n > 0 else b""
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(data)
            if q.get("follow", ["false"])[0] not in ("true", "1"):
                return
            offset = path.stat().st_size if path.exists() else 0
            while alive():
                time.sleep(0.5)
                if path.exists() and path.stat().st_size > offset:
                    with path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    offset += len(chunk)
                    self.wfile.write(chunk)
                    self.wfile.flush()

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="kubelet-api").start()
    return server
