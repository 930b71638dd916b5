"""`frota cache fill URI --dest DIR/NAME` and `frota cache wait DIR --timeout S`: the two
halves of spec.model.cache. The operator's Job runs `fill` once per InferenceService and
model (it downloads with `frota.server.fetch`, atomically, then writes the marker
DIR/.frota-cache.json LAST); every worker pod's init container runs `wait`, which only
reads the read-only claim until the marker is there, so no pod ever downloads.

While `fill` downloads it answers GET :PORT/progress (--progress-port) with {"bytes", "totalBytes"}:
the bytes of its partial on disk and the source's Content-Length where one is announced.
The operator reads it (frota.operator.model_cache_progress), as it reads the workers'
/metrics, so the Job needs no API access at all.

`fill --convert DIR` (the vllm runtime's GGUF models) then writes the HF-layout copy vLLM
reads into DIR, by `frota convert`'s exporter, before the marker: so what is cached is the
converted form and no pod converts. An `alias:` URI is not downloaded (the image holds it),
only converted."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MARKER = ".frota-cache.json"
POLL_SECONDS = 2.0
# `fill`'s exit status when another try cannot help (the body's sha256 is not the URL's, the
# model cannot be converted): the Job's podFailurePolicy fails the Job at once on it,
# instead of downloading the same wrong bytes backoffLimit times more.
EXIT_PERMANENT = 3
TERMINATION_LOG = "/dev/termination-log"  # the container's terminationMessagePath
PROGRESS_PATH = "/progress"
TOTAL_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    fill = sub.add_parser("fill", help="download URI to --dest, then write the marker beside it")
    fill.add_argument("uri", help="hf://ORG/REPO or an https:// URL (as `frota fetch`)")
    fill.add_argument("--dest", required=True, help="DIR/NAME: the download; the marker is DIR/" + MARKER)
    fill.add_argument("--convert", metavar="DIR", default=None,
                      help="then convert the GGUF model into DIR as an HF-layout checkpoint (for vLLM)")
    fill.add_argument("--progress-port", type=int, default=None,
                      help=f"serve GET {PROGRESS_PATH} (bytes so far, total) on this port while downloading")
    wait = sub.add_parser("wait", help="wait until DIR/" + MARKER + " exists")
    wait.add_argument("dir", help="the cache directory (the claim's subPath, mounted read-only)")
    wait.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")


def files_of(path: Path) -> dict[str, dict[str, Any]]:
    """Each regular file under `path` (or `path` itself): its size and sha256."""
    paths = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    out: dict[str, dict[str, Any]] = {}
    for p in paths:
        digest = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        out[p.name if p == path else str(p.relative_to(path))] = {
            "size": p.stat().st_size, "sha256": digest.hexdigest()}
    return out


def write_marker(dest: Path, uri: str, checked: list[str], converted: Path | None = None) -> Path:
    """DEST's files (and the converted copy's, under its directory name), what was checked
    while downloading, and when; written atomically."""
    files = files_of(dest) if dest.exists() else {}
    if converted is not None:
        files |= {f"{converted.name}/{name}": f for name, f in files_of(converted).items()}
    marker = dest.parent / MARKER
    body = {"uri": uri, "path": dest.name, "checked": checked, "files": files,
            "bytes": sum(f["size"] for f in files.values()),
            "completedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if converted is not None:
        body["converted"] = converted.name
    from frota.server.fetch import partial_path

    partial = partial_path(marker)
    partial.write_text(json.dumps(body, indent=1, sort_keys=True))
    partial.replace(marker)
    return marker


class ConversionError(Exception):
    """The model cannot be converted (not GGUF, an architecture the exporter lacks)."""


def convert(source: str, into: Path) -> None:
    """Write the GGUF model `source` (an alias or a .gguf path) into `into` as an HF-layout
    checkpoint, atomically: INTO.partial-PID-RANDOM renamed at the end. What a killed run left (a
    partial, or a whole copy without the marker that vouches for it) is removed first."""
    import shutil

    from frota.engine.errors import ModelNotFoundError, UnsupportedModelError
    from frota.engine.loader.export import export_hf  # torch: only where a conversion runs
    from frota.server.fetch import partial_path

    into.parent.mkdir(parents=True, exist_ok=True)  # an image-baked model downloaded nothing there
    for stale in [into, *into.parent.glob(f"{_glob_escape(into.name)}.partial-*")]:
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    partial = partial_path(into)
    try:
        try:
            export_hf(source, partial, verbose=False)
        except (ModelNotFoundError, UnsupportedModelError) as exc:
            raise ConversionError(f"{source}: cannot convert: {exc}") from None
        partial.rename(into)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The marker's contents, or None while it is absent or unreadable (not yet complete)."""
    try:
        body = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def wait_for_marker(directory: Path, timeout: float, poll: float = POLL_SECONDS) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while True:
        if (body := read_marker(directory)) is not None:
            return body
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


class Stopped(BaseException):
    """SIGTERM during `fill`: its pod is going (deleted, evicted, its node drained)."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped


def run(args: argparse.Namespace) -> int:
    if args.action == "wait":
        body = wait_for_marker(Path(args.dir), args.timeout)
        if body is None:
            print(f"frota cache wait: no {MARKER} in {args.dir} after {args.timeout:g}s: is the "
                  "model-cache Job running? (kubectl get jobs)", file=sys.stderr)
            return 1
        print(f"frota cache wait: {body.get('uri')} is cached ({body.get('bytes')} bytes)", file=sys.stderr)
        return 0
    # Lazily: the command line sits above the data plane (tests/test_layering.py).
    from frota.server.fetch import FetchError, expected_sha256, fetch

    dest = Path(args.dest)
    converted = Path(args.convert) if args.convert else None
    if (body := read_marker(dest.parent)) is not None and body.get("uri") == args.uri and (
            converted is None or body.get("converted") == converted.name):
        print(f"frota cache fill: {args.uri} is already cached in {dest.parent}", file=sys.stderr)
        return 0  # a recreated Job finds the work done
    image_baked = args.uri.startswith("alias:")
    if image_baked and converted is None:
        print(f"frota cache fill: {args.uri} is in the image: only --convert has work to do", file=sys.stderr)
        return 2
    server = serve_progress(dest, args.uri, args.progress_port) if args.progress_port else None
    # In a pod `fill` is pid 1, which the kernel spares a SIGTERM it has no handler for: the
    # download would go on for the whole grace period of a deleted pod. Stop at once instead,
    # removing the partial (fetch's cleanup runs as the exception passes), and let the Job
    # start its next pod.
    signal.signal(signal.SIGTERM, _stop)
    try:
        checked: list[str] = []
        if not image_baked:
            fetch(args.uri, dest, "model")
            checked = ["content-length"] + (["sha256"] if expected_sha256(args.uri) else [])
        if converted is not None:
            convert(args.uri.removeprefix("alias:") if image_baked else str(dest), converted)
            checked.append("converted")
        marker = write_marker(dest, args.uri, checked, converted)
    except (FetchError, ConversionError) as exc:
        print(f"frota cache fill: {exc}", file=sys.stderr)
        return EXIT_PERMANENT if _permanent(exc) else 1
    except OSError as exc:
        print(f"frota cache fill: {args.uri}: cannot write {converted or dest}: {exc}", file=sys.stderr)
        return 1
    except Stopped:
        print(f"frota cache fill: {args.uri}: stopped by SIGTERM before the end; nothing was "
              f"left at {converted or dest}", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    print(f"frota cache fill: {args.uri} -> {converted or dest}", file=sys.stderr)
    _report(json.loads(marker.read_text())["bytes"])
    return 0


def _permanent(exc: Exception) -> bool:
    # fetch names a checksum problem (a mismatch, a malformed #sha256=) in its message.
    return isinstance(exc, ConversionError) or "sha256" in str(exc)


def _report(size: int) -> None:
    """{"bytes": N} as the container's termination message: what status.modelCache shows."""
    log = Path(TERMINATION_LOG)
    if not log.is_file():
        return  # not in a pod: nothing to tell, and /dev is no place to create a file
    with contextlib.suppress(OSError):
        log.write_text(json.dumps({"bytes": size}))


def downloaded_bytes(dest: Path) -> int:
    """Bytes written so far: DEST's partials (a file or a directory) and DEST once renamed."""
    total = 0
    for path in [dest, *dest.parent.glob(f"{_glob_escape(dest.name)}.partial-*")]:
        with contextlib.suppress(OSError):  # renamed or removed while we look
            if path.is_file():
                total += path.stat().st_size
            elif path.is_dir():
                total += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return total


def announced_bytes(uri: str) -> int | None:
    """The Content-Length of a single-file https:// URI (a .gguf or an archive); None for a
    directory or hf:// (many files), or when the server does not say. Asked by a GET that
    is closed unread, not a HEAD: a presigned URL is signed for GET only."""
    from frota.server.fetch import ARCHIVE_SUFFIXES  # lazily, as run() (the layering)

    url = uri.split("#", 1)[0]
    if not uri.startswith("https://") or not url.split("?", 1)[0].endswith((*ARCHIVE_SUFFIXES, ".gguf")):
        return None
    request = urllib.request.Request(url, headers={"User-Agent": "frota-fetch"})
    if token := os.environ.get("HF_TOKEN"):
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TOTAL_TIMEOUT_S,
                                    context=ssl.create_default_context()) as response:
            length = response.headers.get("Content-Length")
    except (OSError, ValueError):
        return None  # progress without a total: bytes only, and the download says why it fails
    return int(length) if length and length.isdigit() else None


def serve_progress(dest: Path, uri: str, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """GET /progress -> {"bytes": N, "totalBytes": M or null}, from a daemon thread."""
    total: list[int | None] = [None]

    class Progress(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != PROGRESS_PATH:
                self.send_error(404)
                return
            body = json.dumps({"bytes": downloaded_bytes(dest), "totalBytes": total[0]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the operator polls: its reads are no news in the Job's log

    server = ThreadingHTTPServer((host, port), Progress)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="progress", daemon=True).start()
    # The total is asked for beside the download, so a slow answer never delays it.
    threading.Thread(target=lambda: total.__setitem__(0, announced_bytes(uri)), daemon=True).start()
    return server


def _glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)
