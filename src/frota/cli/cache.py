"""`frota cache fill URI --dest DIR/PATH --cache-dir DIR` and `frota cache wait DIR`: the two
halves of spec.model.cache. The operator's Job runs `fill` once per InferenceService and
model (it downloads with `frota.server.fetch`, atomically and fsynced, then writes the
marker DIR/.frota-cache.json LAST: the manifest of every file's size and sha256, see
`frota.engine.loader.cache_manifest`); every worker pod's init container runs `wait`,
which only reads the read-only claim until the marker is there, then checks every file
against the manifest (and the pinned sha256, --sha256), so no pod downloads, and none
starts on a file that changed since. `frota cache digest PATH` prints the sha256 that
spec.model.sha256 names for a file or a directory.

While `fill` downloads it answers GET :PORT/progress (--progress-port) with {"bytes", "totalBytes"}:
the bytes of its partial on disk and the source's Content-Length where one is announced.
The operator reads it (frota.operator.reports.model_cache_progress), as it reads the workers'
/metrics, so the Job needs no API access at all.

`fill --convert DIR` (the vllm runtime's GGUF models) then writes the HF-layout copy vLLM
reads into DIR, by `frota convert`'s exporter, before the marker: so what is cached is the
converted form and no pod converts. An `alias:` URI is not downloaded (the image holds it),
only converted."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from frota.api.contract import CacheJob, Env, ModelScheme
from frota.cli.fetch import sha256_arg

POLL_SECONDS = 2.0
TERMINATION_LOG = "/dev/termination-log"  # the container's terminationMessagePath
TOTAL_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    fill = sub.add_parser("fill", help="download URI to --dest, then write the marker in --cache-dir")
    fill.add_argument("uri", help="hf://ORG/REPO or an https:// URL (as `frota fetch`)")
    fill.add_argument("--dest", required=True, help="DIR/PATH: where the download goes, under --cache-dir")
    fill.add_argument("--cache-dir", default=None,
                      help=f"DIR: the cache directory, where the marker {CacheJob.MARKER} goes (default: DEST's parent)")
    fill.add_argument("--sha256", type=sha256_arg, default=None,
                      help="the source's pinned sha256 (a file's, an archive's, or a directory's as "
                      "`frota cache digest` prints it): enforced at the download")
    fill.add_argument("--convert", metavar="DIR", default=None,
                      help="then convert the GGUF model into DIR as an HF-layout checkpoint (for vLLM)")
    fill.add_argument("--progress-port", type=int, default=None,
                      help=f"serve GET {CacheJob.PROGRESS_PATH} (bytes so far, total) on this port while downloading")
    wait = sub.add_parser("wait", help=f"wait until DIR/{CacheJob.MARKER} exists, then check the files against it")
    wait.add_argument("dir", help="the cache directory (the claim's subPath, mounted read-only)")
    wait.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the marker (default 3600)")
    wait.add_argument("--sha256", type=sha256_arg, default=None,
                      help="the pinned sha256 (spec.model.sha256) the cached source must have")
    digest = sub.add_parser("digest", help="print the sha256 of a file, or of a directory's files "
                            "(what spec.model.sha256 names)")
    digest.add_argument("path", help="a file, or a directory such as `frota fetch` writes")


def write_marker(root: Path, dest: Path, uri: str, checked: list[str],
                 downloaded: Mapping[Path, str] | None = None, source: tuple[str, str] | None = None,
                 converted: Path | None = None) -> Path:
    """The manifest, written last and durably: each file of the download (`downloaded`:
    path -> sha256, hashed before it was published) and of the converted copy, named
    relative to the cache directory `root`; the source's (sha256, of what); what was
    checked, and when."""
    from frota.engine.loader.cache_manifest import VERSION, FileRecord, record
    from frota.server.fetch import fsync_tree, partial_path

    files: dict[str, FileRecord] = {}
    if downloaded:
        files = {p.relative_to(root).as_posix(): FileRecord(p.stat().st_size, d) for p, d in downloaded.items()}
    if converted is not None:
        files |= record(root, [converted])
    body: dict[str, Any] = {
        "version": VERSION, "uri": uri, "path": dest.relative_to(root).as_posix(), "checked": checked,
        "files": {name: f.to_json() for name, f in sorted(files.items())},
        "bytes": sum(f.size for f in files.values()),
        "completedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if source is not None:
        body |= {"sha256": source[0], "sha256Of": source[1]}
    if converted is not None:
        body["converted"] = converted.relative_to(root).as_posix()
    marker = root / CacheJob.MARKER
    partial = partial_path(marker)
    with partial.open("w") as f:
        f.write(json.dumps(body, indent=1, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    partial.replace(marker)
    fsync_tree(root, recursive=False)  # the rename
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
    from frota.server.fetch import fsync_tree, partial_path

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
        fsync_tree(partial)
        partial.rename(into)
        fsync_tree(into.parent, recursive=False)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The marker's contents, or None while it is absent or unreadable (not yet complete)."""
    from frota.engine.loader.cache_manifest import read

    return read(directory)


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
        return wait(Path(args.dir), args.timeout, args.sha256)
    if args.action == "digest":
        return digest(Path(args.path))
    return fill(args)


def wait(root: Path, timeout: float, sha256: str | None = None) -> int:
    """Wait for the marker, then check the cache against it: 0 when every file is what the
    manifest (and the pin) says; CacheJob.EXIT_PERMANENT, with the file and both digests as the
    container's termination message, when one is not; 1 when no marker came in time."""
    body = wait_for_marker(root, timeout)
    if body is None and (root / CacheJob.MARKER).exists():
        # The Job renames a whole marker into place: one that stays unreadable was damaged.
        message = f"frota cache wait: {root / CacheJob.MARKER} is not a JSON object: delete the model-cache Job to fill it again"
        print(message, file=sys.stderr)
        _terminate(message)
        return CacheJob.EXIT_PERMANENT
    if body is None:
        print(f"frota cache wait: no {CacheJob.MARKER} in {root} after {timeout:g}s: is the "
              "model-cache Job running? (kubectl get jobs)", file=sys.stderr)
        return 1
    # Lazily: the command line sits above the data plane (tests/test_layering.py).
    from frota.engine.loader.cache_manifest import CacheIntegrityError, verify

    started = time.monotonic()
    try:
        manifest = verify(root, body, sha256)
    except CacheIntegrityError as exc:
        message = (f"frota cache wait: {exc}. The cache is not what was downloaded: delete the "
                   "model-cache Job; its next run checks the cache and downloads it again")
        print(message, file=sys.stderr)
        _terminate(message)
        return CacheJob.EXIT_PERMANENT
    print(f"frota cache wait: {body.get('uri')} is cached; {len(manifest.files)} files "
          f"({manifest.bytes} bytes) match the manifest{' and the pinned sha256' if sha256 else ''} "
          f"({time.monotonic() - started:.1f}s)", file=sys.stderr)
    return 0


def digest(path: Path) -> int:
    """Print the sha256 spec.model.sha256 names for `path`: a file's, or a directory's."""
    from frota.engine.loader.digests import (
        RefusedFile,
        file_sha256,
        files_sha256,
        regular_files,
        tree_sha256,
    )

    try:
        if path.is_dir():
            files = regular_files(path)
            print(tree_sha256({p.relative_to(path).as_posix(): d
                               for p, d in zip(files, files_sha256(files), strict=True)}))
        else:
            print(file_sha256(path))
    except (OSError, RefusedFile) as exc:
        print(f"frota cache digest: {exc}", file=sys.stderr)
        return 1
    return 0


def fill(args: argparse.Namespace) -> int:
    # Lazily: the command line sits above the data plane (tests/test_layering.py).
    from frota.engine.loader.cache_manifest import CacheIntegrityError, verify
    from frota.engine.loader.digests import RefusedFile
    from frota.server.fetch import FetchError, download, expected_sha256

    dest = Path(args.dest)
    root = Path(args.cache_dir) if args.cache_dir else dest.parent
    converted = Path(args.convert) if args.convert else None
    for path in (dest, converted):
        if path is not None and (path == root or not path.is_relative_to(root)):
            print(f"frota cache fill: {path} is not under the cache directory {root}", file=sys.stderr)
            return 2
    if (body := read_marker(root)) is not None and body.get("uri") == args.uri and (
            converted is None or body.get("converted") == converted.relative_to(root).as_posix()):
        try:
            verify(root, body, args.sha256)
        except CacheIntegrityError as exc:
            # A recreated Job is how a user asks for a new copy of a cache that failed its
            # check: the marker goes first, so no worker takes what follows for a whole cache.
            print(f"frota cache fill: the cached copy fails its check ({exc}): downloading it again",
                  file=sys.stderr)
            (root / CacheJob.MARKER).unlink()
        else:
            print(f"frota cache fill: {args.uri} is already cached in {root}", file=sys.stderr)
            return 0  # a recreated Job finds the work done
    image_baked = args.uri.startswith(ModelScheme.ALIAS)
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
        files, source = None, None
        if not image_baked:
            got = download(args.uri, dest, "model", args.sha256, digests=True)
            files = got.files
            source = (got.sha256, got.sha256_of) if got.sha256 and got.sha256_of else None
            pinned = args.sha256 or expected_sha256(args.uri)
            checked = ["content-length"] + (["sha256"] if pinned else [])
        if converted is not None:
            convert(args.uri.removeprefix(ModelScheme.ALIAS) if image_baked else str(dest), converted)
            checked.append("converted")
        # An earlier Frota wrote an hf:// model's marker beside ORG/REPO, where the loader,
        # which takes the nearest marker above the model, would find it first.
        for between in dest.relative_to(root).parents[:-1]:
            (root / between / CacheJob.MARKER).unlink(missing_ok=True)
        marker = write_marker(root, dest, args.uri, checked, files, source, converted)
    except (FetchError, ConversionError) as exc:
        print(f"frota cache fill: {exc}", file=sys.stderr)
        return CacheJob.EXIT_PERMANENT if _permanent(exc) else 1
    except (OSError, RefusedFile) as exc:
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
    from frota.server.fetch import ChecksumError

    # A checksum (a mismatch, a malformed pin) or a model the exporter refuses: the same
    # bytes again. Not a network error, even one whose URI carries #sha256=.
    return isinstance(exc, ConversionError | ChecksumError)


def _report(size: int) -> None:
    """{"bytes": N} as the container's termination message: what status.modelCache shows."""
    _terminate(json.dumps({"bytes": size}))


def _terminate(message: str) -> None:
    """`message` as the container's termination message (where the operator reads it)."""
    log = Path(TERMINATION_LOG)
    if not log.is_file():
        return  # not in a pod: nothing to tell, and /dev is no place to create a file
    with contextlib.suppress(OSError):
        log.write_text(message)


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
    if token := os.environ.get(Env.HF_TOKEN):
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
            if self.path != CacheJob.PROGRESS_PATH:
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
