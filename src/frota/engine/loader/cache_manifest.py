"""The model cache's manifest, `.frota-cache.json`: what `frota cache fill` wrote, file by
file (size and sha256), and the check that the files are still that, which `frota cache
wait` runs at every pod start and the loader at every load of a cached model.

Trust on first use: an `hf://` or `https://` model without a pinned digest has its files'
digests recorded at its first download, and nothing changes them unnoticed afterwards
(a bad disk, a half-restored backup, a writer that is not the Job). A pinned digest
(spec.model.sha256, or the URI's `#sha256=`) is enforced at the first download and
checked again at each `wait` against the files themselves: the manifest sits on the same
volume, so it vouches for nothing a writer of that volume could change, and the pin,
which comes from the spec, does.

The manifest (version 2; names relative to the cache directory, `/`-separated):

    {"version": 2, "uri": ..., "path": "org/repo", "converted": "converted",
     "files": {"org/repo/config.json": {"size": N, "sha256": HEX}, ...},
     "sha256": HEX, "sha256Of": "file" | "directory" | "archive", "bytes": N, ...}

`sha256` is the source's own digest, what a pin names: a single file's, a directory's
(`digests.tree_sha256`), or the archive's that was downloaded and unpacked. An image-baked
model that is only converted has none. A manifest without `version` was written by an
earlier Frota: its names are relative to `path` (a directory) or are `path` (a file), and
the converted files' are relative to the cache directory; they are read as such.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

from frota.api.contract import CacheJob, ModelScheme
from frota.engine.loader.digests import RefusedFile, files_sha256, regular_files, tree_sha256

MARKER = CacheJob.MARKER  # `frota cache fill` writes it
VERSION = 2
SOURCE_KINDS = ("file", "directory", "archive")
HEX = frozenset("0123456789abcdef")


class CacheIntegrityError(Exception):
    """What is in the cache is not what its manifest, or the pinned digest, says: a file
    changed, went missing or appeared, or the manifest is not one. The message names the
    file and, for a changed one, both digests. Another try cannot help."""


@dataclass(frozen=True)
class FileRecord:
    """One file of the cache, as the manifest records it."""

    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    """A manifest read and checked for shape (not yet against the files)."""

    path: str  # the download, relative to the cache directory; "" when nothing was downloaded
    converted: str | None
    files: dict[str, FileRecord]
    sha256: str | None
    sha256_of: str | None

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files.values())


def record(root: Path, tops: list[Path]) -> dict[str, FileRecord]:
    """Size and sha256 of every regular file under each of `tops` (files or directories
    under the cache directory `root`), named relative to `root`."""
    paths = [p for top in tops for p in regular_files(top)]
    return {_name(root, p): FileRecord(p.stat().st_size, d)
            for p, d in zip(paths, files_sha256(paths), strict=True)}


def source_sha256(files: Mapping[str, FileRecord], top: str) -> str:
    """The digest a pin names, of the download `top` (a name relative to the cache
    directory): the file's own, or the directory's from its files'."""
    if top in files:
        return files[top].sha256
    prefix = top + "/"
    return tree_sha256({n.removeprefix(prefix): f.sha256 for n, f in files.items() if n.startswith(prefix)})


def parse(body: Mapping[str, Any], root: Path) -> Manifest:
    """The manifest in `body` (the marker's JSON), or CacheIntegrityError saying what is
    wrong with it. Every name must stay inside the cache directory."""
    where = root / MARKER
    files = body.get("files")
    path, converted = body.get("path", ""), body.get("converted")
    if not isinstance(files, dict) or not files:
        raise CacheIntegrityError(f"{where}: records no files and their digests: it was not "
                                  "written by `frota cache fill` (or by one that never checks)")
    if not (path == "" or _safe(path)) or not (converted is None or _safe(converted)):
        raise CacheIntegrityError(f"{where}: its path or converted names a place outside the cache directory")
    if (version := body.get("version")) is None:
        files = _legacy_names(files, root, path, converted)
    elif version != VERSION:
        raise CacheIntegrityError(f"{where}: manifest version {version!r}, and this Frota reads "
                                  f"version {VERSION}: fill the cache with the same image")
    records: dict[str, FileRecord] = {}
    for name, entry in files.items():
        size = entry.get("size") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not _safe(name) or PurePosixPath(name).name == MARKER:
            raise CacheIntegrityError(f"{where}: the file name {name!r} is outside the cache directory")
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0 and _is_hex(digest)):
            raise CacheIntegrityError(f"{where}: the record of {name} is not a size and a sha256")
        records[name] = FileRecord(size, digest)
    digest, of = body.get("sha256"), body.get("sha256Of")
    if digest is not None and not (_is_hex(digest) and of in SOURCE_KINDS):
        raise CacheIntegrityError(f"{where}: its source sha256 is not 64 hex digits of a file, "
                                  "a directory or an archive")
    return Manifest(path, converted, records, digest, of if digest is not None else None)


def verify(root: Path, body: Mapping[str, Any], expected_sha256: str | None = None) -> Manifest:
    """Check the cache directory `root` against its manifest `body`: every file recorded is
    there, a regular file of the recorded size and sha256; no other file is where the
    worker loads from; and, with `expected_sha256` (the pin), the source's digest is the
    pin. Raises CacheIntegrityError naming the first file that differs."""
    manifest = parse(body, root)
    recorded = manifest.files
    _check_directories(root, [*recorded, manifest.path, manifest.converted or ""])
    on_disk = _files_under(root, [t for t in (manifest.path, manifest.converted) if t])
    if extra := sorted(set(on_disk) - set(recorded)):
        raise CacheIntegrityError(f"{root / extra[0]}: not in the cache's manifest ({root / MARKER}): "
                                  "a file the download did not write, where the worker loads from")
    names = sorted(recorded)
    for name in names:
        try:
            mode = os.lstat(root / name)
        except FileNotFoundError:
            raise CacheIntegrityError(f"{root / name}: missing, though the cache's manifest records "
                                      f"it (sha256 {recorded[name].sha256})") from None
        if not stat.S_ISREG(mode.st_mode):
            raise CacheIntegrityError(f"{root / name}: not a regular file (a link?) where the manifest records one")
        if mode.st_size != recorded[name].size:  # found before hashing the rest
            _mismatch(root, name, recorded[name], _hash([root / name])[0], mode.st_size)
    actual = dict(zip(names, _hash([root / n for n in names]), strict=True))
    for name in names:
        if actual[name] != recorded[name].sha256:
            _mismatch(root, name, recorded[name], actual[name], (root / name).stat().st_size)
    if expected_sha256 is not None:
        _check_pin(root, manifest, expected_sha256)
    return manifest


def _hash(paths: list[Path]) -> list[str]:
    try:
        return files_sha256(paths)
    except (OSError, RefusedFile) as exc:  # replaced by a link, or gone, since it was looked at
        raise CacheIntegrityError(f"cannot read a cached file: {exc}") from None


def _mismatch(root: Path, name: str, want: FileRecord, digest: str, size: int) -> NoReturn:
    raise CacheIntegrityError(
        f"{root / name}: sha256 {digest} ({size} bytes) on disk, but the cache's manifest "
        f"recorded {want.sha256} ({want.size} bytes) at the download: the file changed since")


def _check_pin(root: Path, manifest: Manifest, pin: str) -> None:
    """The pin against the source's digest: recomputed from the files just verified, for a
    file or a directory; as recorded, for an archive (it was unpacked: its own bytes are
    gone, and were checked against the pin when they were downloaded)."""
    what = root / manifest.path if manifest.path else root
    if manifest.sha256 is None or not manifest.path:
        raise CacheIntegrityError(f"{what}: the cache's manifest records no source sha256 to check "
                                  f"against the pinned {pin}")
    if manifest.sha256_of != "archive":
        actual = source_sha256(manifest.files, manifest.path)
        if actual != manifest.sha256:
            raise CacheIntegrityError(f"{what}: sha256 {actual} on disk, but the cache's manifest "
                                      f"recorded {manifest.sha256}")
    if manifest.sha256 != pin:
        raise CacheIntegrityError(f"{what}: sha256 {manifest.sha256} ({manifest.sha256_of}), but "
                                  f"the pinned sha256 is {pin}")


def read(root: Path) -> dict[str, Any] | None:
    """The marker's JSON object, or None while it is absent or not yet whole."""
    try:
        body = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def find_cache(model: Path) -> Path | None:
    """The cache directory that holds `model` (its own directory or an ancestor with a
    marker), or None for a model that is not in one."""
    for directory in [model, *model.parents] if model.is_dir() else model.parents:
        if (directory / MARKER).exists():
            return directory
    return None


def verify_model(model: str) -> Manifest | None:
    """The loader's check: when the model path `model` is in a model cache, verify the
    cache (every file, not only the model's) and that the manifest covers `model`. None:
    not a cached model (an alias, a synthetic spec, a path of no cache)."""
    path = Path(os.path.expanduser(model))
    if model.startswith((ModelScheme.SYNTHETIC, ModelScheme.ALIAS)) or not path.exists():
        return None
    path = path.absolute()
    root = find_cache(path)
    if root is None:
        return None
    body = read(root)
    if body is None:
        raise CacheIntegrityError(f"{root / MARKER}: not a readable manifest")
    relative = path.relative_to(root).as_posix()
    manifest = verify(root, body)
    tops = [t for t in (manifest.path, manifest.converted) if t]
    if not any(relative == t or relative.startswith(t + "/") for t in tops):
        raise CacheIntegrityError(f"{path}: in the cache directory {root}, but not what its "
                                  f"manifest records ({', '.join(tops) or 'nothing'})")
    return manifest


def _check_directories(root: Path, names: list[str]) -> None:
    """Every directory on the way from `root` to each name is a directory, not a link: a
    linked directory would have the check (and the loader) read files outside the cache."""
    directories = {PurePosixPath(n).parents[i] for n in names if n
                   for i in range(len(PurePosixPath(n).parents) - 1)}
    for directory in sorted(directories, key=lambda d: len(d.parts)):
        try:
            mode = os.lstat(root / directory).st_mode
        except FileNotFoundError:
            continue  # its files are missing: named by the check that follows
        if not stat.S_ISDIR(mode):
            raise CacheIntegrityError(f"{root / directory}: a link or a file where the cache's "
                                      "manifest has a directory: the cache holds regular files only")


def _files_under(root: Path, tops: list[str]) -> list[str]:
    out: list[str] = []
    for top in tops:
        if not os.path.lexists(root / top):
            continue  # a recorded file that is missing is named by the check that follows
        try:
            out += [_name(root, p) for p in regular_files(root / top)]
        except RefusedFile as exc:
            raise CacheIntegrityError(f"{exc}: the cache holds regular files only") from None
    return out


def _legacy_names(files: dict[str, Any], root: Path, path: str, converted: str | None) -> dict[str, Any]:
    """An earlier manifest's names, made relative to the cache directory."""
    is_dir = os.path.isdir(root / path) and not os.path.islink(root / path) if path else False
    out = {}
    for name, entry in files.items():
        if not isinstance(name, str):
            continue
        inside = (converted and name.startswith(converted + "/")) or not is_dir
        out[name if inside else f"{path}/{name}"] = entry
    return out


def _name(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _safe(name: Any) -> bool:
    """A relative `/` path that stays inside the directory it is relative to."""
    if not isinstance(name, str) or "\\" in name or "\0" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _is_hex(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX
