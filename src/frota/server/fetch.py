"""Downloads of models and LoRA adapters: what `frota fetch URI --dest PATH` runs in an init
container, and what the worker runs for a runtime load from an `https://` `lora_path`.

It lives in the data plane (the worker's package, torch-free) because both the worker and
the `frota` command use it, and the worker may not import the command line.

- `https://HOST/PATH/` (a directory URL, trailing slash optional): the files of a PEFT
  adapter (adapter_config.json, adapter_model.safetensors) or, when there is no
  adapter_config.json, of an HF-layout model (config.json, tokenizer.json, the weights as
  model.safetensors or the shards a model.safetensors.index.json names, and the optional
  tokenizer_config.json, generation_config.json, special_tokens_map.json,
  chat_template.jinja). Plain HTTP has no directory listing, so the names are these.
- `https://.../NAME.tar`, `.tar.gz`, `.tgz`: the archive, unpacked; only regular files
  and directories, no absolute names, no `..`. An archive holding one top directory is
  that directory's contents.
- `https://.../NAME.gguf`: one GGUF file, written at DEST (a file).
- `hf://ORG/REPO`: `huggingface_hub.snapshot_download`, when that package is installed.

Trust: Python's default TLS context, so SSL_CERT_FILE (spec.model.caBundle) adds a CA; the
system's CAs stay trusted too. HF_TOKEN, when set, is sent as a bearer token to the URL's
own host only (never along a redirect). Atomic: everything is written under
DEST.partial-PID-RANDOM (`partial_path`) and renamed to DEST at the end; a failure removes
it, so DEST is either the whole download or absent (or what was there before); the
DEST.partial-* a killed run left are removed before a new one starts, so they are never
loaded. The name is one no other writer has: a process in a container is often pid 1 in
every pod, and a pod deleted by force may still be writing when the Job's next pod starts;
with a shared name, the old writer's rename could publish the new one's half file. A body
shorter than its Content-Length is a failure.

Digests: a `#sha256=HEX` fragment on a single-file URL (.gguf or an archive) pins the
body; a `sha256` argument (spec.model.sha256) pins the source, whatever its layout: a
single file's body, an archive's bytes, or a directory's files by its digest
(`frota.engine.loader.digests.tree_sha256`, what `frota cache digest DIR` prints). A
mismatch is a `ChecksumError` and leaves nothing at DEST.

Durable: every file and directory of the download is fsynced before the rename that
publishes it, and the parent directory after it, so a node that loses power never shows
DEST (or the cache's marker written after it) over bytes that did not reach the disk.

Every failure is a `FetchError` whose one-line message names the URI and what went wrong.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import shutil
import ssl
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from frota.api.contract import Env, ModelScheme
from frota.engine.loader.digests import RefusedFile, files_sha256, regular_files, tree_sha256

Kind = Literal["auto", "adapter", "model"]
SourceKind = Literal["file", "directory", "archive"]

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_FILES = ("config.json", "tokenizer.json")
MODEL_OPTIONAL_FILES = ("tokenizer_config.json", "generation_config.json",
                        "special_tokens_map.json", "chat_template.jinja")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
HF_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.gguf", "*.model", "*.txt"]
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60.0  # per socket operation, not for the whole download
HF_INSTALL_HINT = "pip install huggingface_hub"


class FetchError(RuntimeError):
    """A download that failed; the message names the URI and the cause, on one line."""


class _NotFound(FetchError):
    """HTTP 404: an optional file may be absent."""


class ChecksumError(FetchError):
    """The download is not what its pinned sha256 names, or the pin is malformed: another
    try downloads the same bytes, so it cannot help."""


@dataclass(frozen=True)
class Download:
    """What `download` wrote: DEST, the source's sha256 (None unless pinned or asked for)
    and what that digest is of, and each file's sha256 when asked for (path -> hex)."""

    path: Path
    sha256: str | None = None
    sha256_of: SourceKind | None = None
    files: dict[Path, str] | None = None


def fetch_adapter(uri: str, dest: str | os.PathLike[str]) -> Path:
    """Download the PEFT adapter at `uri` into the directory `dest`; its path."""
    return fetch(uri, dest, "adapter")


def fetch_model(uri: str, dest: str | os.PathLike[str]) -> Path:
    """Download the model at `uri` to `dest` (a directory, or a file for a .gguf URL)."""
    return fetch(uri, dest, "model")


def partial_path(target: Path) -> Path:
    """Where `target` is written before its rename: TARGET.partial-PID-RANDOM, a name no
    other writer, in this pod or another, has (see the module docstring)."""
    return target.with_name(f"{target.name}.partial-{os.getpid()}-{secrets.token_hex(4)}")


def fetch(uri: str, dest: str | os.PathLike[str], kind: Kind = "auto", sha256: str | None = None) -> Path:
    """Download `uri` to `dest` atomically; `auto` tells an adapter from a model by its files.
    `sha256`: the source's pinned digest (see the module docstring)."""
    return download(uri, dest, kind, sha256).path


def download(uri: str, dest: str | os.PathLike[str], kind: Kind = "auto", sha256: str | None = None,
             digests: bool = False) -> Download:
    """`fetch`, saying what was written: with `digests`, the source's sha256 and each file's
    (the model cache records them), hashed from the download before it is published."""
    target = Path(dest)
    pin = _pin(uri, sha256)
    partial = partial_path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Left by an earlier run that was killed (a Job's retry, a container's pid 1): never loaded.
    for stale in target.parent.glob(f"{glob_escape(target.name)}.partial-*"):
        _remove(stale)
    try:
        source, of = _layout(uri, partial, kind, pin)
        files = {partial: source} if source is not None and of == "file" else None
        if files is None and (digests or (pin is not None and of == "directory")):
            files = _digests(uri, partial)
            if of == "directory":
                source = tree_sha256({p.relative_to(partial).as_posix(): d for p, d in files.items()})
        if pin is not None and source != pin:  # a file's and an archive's were checked as they came
            raise ChecksumError(f"{uri}: sha256 mismatch: the downloaded {of}'s is {source}, "
                                f"the expected {pin}")
        fsync_tree(partial)
        _replace(partial, target)
        fsync_tree(target.parent, recursive=False)  # the rename itself
    except BaseException:
        _remove(partial)
        raise
    published = None if files is None else {target / p.relative_to(partial): d for p, d in files.items()}
    return Download(target, source, of if source is not None else None, published)


def _layout(uri: str, partial: Path, kind: Kind, pin: str | None) -> tuple[str | None, SourceKind]:
    """Download `uri` into `partial` by its layout; the body's sha256 where one body was
    streamed (a file, an archive), and what the source is."""
    if uri.startswith(ModelScheme.HF):
        _from_hub(uri, partial, kind)
        return None, "directory"
    if not uri.startswith("https://"):
        raise FetchError(f"{uri}: only https:// and hf:// URIs can be downloaded")
    if _path_of(uri).endswith(ARCHIVE_SUFFIXES):
        return _from_archive(uri, partial, kind, pin), "archive"
    if _path_of(uri).endswith(".gguf"):
        if kind == "adapter":
            raise FetchError(f"{uri}: a .gguf file is a model, not a LoRA adapter")
        return _download(uri, uri, partial, pin)[1], "file"
    _from_directory(uri, partial, kind)
    return None, "directory"


def _pin(uri: str, sha256: str | None) -> str | None:
    """The digest the download must have: `sha256`, the URL's #sha256=, or both when they
    agree; a malformed one, or a fragment on a URL of many files, is a ChecksumError."""
    fragment = expected_sha256(uri)
    if sha256 is not None:
        sha256 = sha256.lower()
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ChecksumError(f"{uri}: the expected sha256 needs 64 hex digits")
    if fragment is not None and not _path_of(uri).endswith((*ARCHIVE_SUFFIXES, ".gguf")):
        raise ChecksumError(f"{uri}: a #sha256= fragment checks one file: a .gguf or an archive URL")
    if fragment is not None and sha256 is not None and fragment != sha256:
        raise ChecksumError(f"{uri}: the URL's #sha256= ({fragment}) and the expected sha256 "
                            f"({sha256}) disagree")
    return sha256 or fragment


def _digests(uri: str, top: Path) -> dict[Path, str]:
    """Each file's sha256 under the download `top`; a link in it is refused."""
    try:
        paths = regular_files(top)
        return dict(zip(paths, files_sha256(paths), strict=True))
    except RefusedFile as exc:
        raise FetchError(f"{uri}: {exc}: a model's files must be regular files") from None


def fsync_tree(path: Path, recursive: bool = True) -> None:
    """Flush `path` to the disk: a file; or a directory, with (`recursive`) every file and
    directory under it. Links are not followed (a download holds none)."""
    if recursive and path.is_dir() and not path.is_symlink():
        for directory, _, names in os.walk(path, topdown=False):
            for name in names:
                _fsync(Path(directory, name))
            _fsync(Path(directory))
    else:
        _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- layouts ---------------------------------------------------------------------------


def _from_directory(uri: str, partial: Path, kind: Kind) -> None:
    partial.mkdir()
    if kind != "model":
        try:
            _download(uri, _join(uri, ADAPTER_FILES[0]), partial / ADAPTER_FILES[0])
        except _NotFound:
            if kind == "adapter":
                raise
        else:
            _download(uri, _join(uri, ADAPTER_FILES[1]), partial / ADAPTER_FILES[1])
            return
    try:
        _download(uri, _join(uri, MODEL_FILES[0]), partial / MODEL_FILES[0])
    except _NotFound:
        raise FetchError(f"{uri}: neither adapter_config.json nor config.json is there: a "
                         "directory URL must hold a PEFT adapter or an HF-layout model") from None
    for name in MODEL_FILES[1:]:
        _download(uri, _join(uri, name), partial / name)
    for name in MODEL_OPTIONAL_FILES:
        _optional(uri, name, partial)
    for name in _weight_files(uri, partial):
        _download(uri, _join(uri, name), partial / name)


def _weight_files(uri: str, partial: Path) -> list[str]:
    """model.safetensors, or the shards its index names (plain file names only)."""
    import json

    if not _optional(uri, "model.safetensors.index.json", partial):
        return ["model.safetensors"]
    try:
        weight_map = json.loads((partial / "model.safetensors.index.json").read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FetchError(f"{uri}: model.safetensors.index.json has no weight_map: {exc}") from None
    bad = [s for s in shards if not isinstance(s, str) or "/" in s or s in ("", ".", "..")]
    if bad:
        raise FetchError(f"{uri}: model.safetensors.index.json names shards outside the directory: {bad}")
    return shards


def _from_archive(uri: str, partial: Path, kind: Kind, sha256: str | None = None) -> str:
    """Unpack the archive at `uri` into `partial`; the archive's sha256."""
    archive = partial.with_name(partial.name + ".archive")
    try:
        _, digest = _download(uri, uri, archive, sha256)
        partial.mkdir()
        _unpack(uri, archive, partial)
    finally:
        archive.unlink(missing_ok=True)
    _flatten_single_directory(partial)
    names = {p.name for p in partial.iterdir()}
    if kind == "adapter" and ADAPTER_FILES[0] not in names:
        raise FetchError(f"{uri}: the archive holds no adapter_config.json")
    if kind == "model" and "config.json" not in names and not any(n.endswith(".gguf") for n in names):
        raise FetchError(f"{uri}: the archive holds neither config.json nor a .gguf file")
    return digest


def _unpack(uri: str, archive: Path, into: Path) -> None:
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts:
                    raise FetchError(f"{uri}: the archive entry {member.name!r} points outside "
                                     "its directory: refused")
                if not (member.isfile() or member.isdir()):
                    raise FetchError(f"{uri}: the archive entry {member.name!r} is not a plain "
                                     "file or directory (a link or device): refused")
            # The "data" filter refuses the same again, and drops modes a file should not keep.
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FetchError(f"{uri}: not a readable tar archive: {exc}") from None


def _flatten_single_directory(root: Path) -> None:
    entries = list(root.iterdir())
    if len(entries) != 1 or not entries[0].is_dir():
        return
    inner = entries[0].rename(root.with_name(root.name + ".inner"))
    root.rmdir()
    inner.rename(root)


def _from_hub(uri: str, partial: Path, kind: Kind) -> None:
    repo = uri.removeprefix(ModelScheme.HF).strip("/")
    if repo.count("/") != 1:
        raise FetchError(f"{uri}: use hf://ORG/REPO")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FetchError(f"{uri}: downloading from the Hugging Face Hub needs the "
                         f"huggingface_hub package, which is not installed: `{HF_INSTALL_HINT}`, "
                         "or serve the files over https://") from None
    patterns = list(ADAPTER_FILES) if kind == "adapter" else HF_PATTERNS
    try:
        snapshot_download(repo_id=repo, local_dir=str(partial), allow_patterns=patterns)
    except Exception as exc:  # the hub client's errors have no common base worth naming
        raise FetchError(f"{uri}: {type(exc).__name__}: {_one_line(exc)}") from None
    shutil.rmtree(partial / ".cache", ignore_errors=True)  # the hub client's own bookkeeping


# --- one file over https ---------------------------------------------------------------


def _optional(uri: str, name: str, partial: Path) -> bool:
    try:
        _download(uri, _join(uri, name), partial / name)
    except _NotFound:
        return False
    return True


def _download(uri: str, url: str, to: Path, sha256: str | None = None) -> tuple[int, str]:
    """GET `url` into the file `to`; the bytes written and their sha256 (checked against
    `sha256` when given). Errors name `uri` and the file."""
    what = uri if url == uri else f"{uri}: {url.rsplit('/', 1)[-1].split('?', 1)[0]}"
    url = urlunsplit(urlsplit(url)._replace(fragment=""))  # the fragment is ours, not the server's
    request = urllib.request.Request(url, headers={"User-Agent": "frota-fetch"})
    if token := os.environ.get(Env.HF_TOKEN):
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    expected: str | None = None
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=_tls_context()) as response:
            expected = response.headers.get("Content-Length")
            received, digest = _copy(response, to)
    except urllib.error.HTTPError as exc:
        error = _NotFound if exc.code == 404 else FetchError
        raise error(f"{what}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise FetchError(f"{what}: TLS verification failed ({reason.verify_message}): trust "
                             "the server's CA with spec.model.caBundle (SSL_CERT_FILE)") from None
        raise FetchError(f"{what}: cannot connect: {_one_line(reason)}") from None
    except http.client.IncompleteRead:
        raise FetchError(f"{what}: truncated: the connection closed before the body's "
                         f"Content-Length ({expected} bytes)") from None
    except (OSError, http.client.HTTPException) as exc:
        raise FetchError(f"{what}: {type(exc).__name__}: {_one_line(exc)}") from None
    if expected is not None and expected.isdigit() and int(expected) != received:
        raise FetchError(f"{what}: truncated: received {received} of {expected} bytes")
    if sha256 is not None and digest != sha256:
        raise ChecksumError(f"{what}: sha256 mismatch: the body's is {digest}, the expected {sha256}")
    return received, digest


def _copy(response: http.client.HTTPResponse, to: Path) -> tuple[int, str]:
    received = 0
    digest = hashlib.sha256()
    with to.open("wb") as out:
        while chunk := response.read(CHUNK_BYTES):
            out.write(chunk)
            digest.update(chunk)
            received += len(chunk)
    return received, digest.hexdigest()


def expected_sha256(uri: str) -> str | None:
    """The lowercase hex of a `#sha256=HEX` fragment, or None; a malformed one is a FetchError."""
    fragment = urlsplit(uri).fragment if uri.startswith("https://") else ""
    if not fragment.startswith("sha256="):
        return None
    value = fragment.removeprefix("sha256=").lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ChecksumError(f"{uri}: #sha256= needs 64 hex digits")
    return value


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def _tls_context() -> ssl.SSLContext:
    """The default context (it reads SSL_CERT_FILE), plus the system's own CA file, so a
    caBundle adds a CA rather than replacing the public ones."""
    context = ssl.create_default_context()
    system = ssl.get_default_verify_paths().openssl_cafile
    if os.environ.get("SSL_CERT_FILE") and system and os.path.isfile(system):
        context.load_verify_locations(cafile=system)
    return context


# --- paths -----------------------------------------------------------------------------


def _path_of(uri: str) -> str:
    return urlsplit(uri).path.rstrip("/")


def _join(uri: str, name: str) -> str:
    """The URL of `name` in the directory URL `uri` (its query string kept)."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + name))


def _replace(partial: Path, target: Path) -> None:
    """Move the finished download to `target`, replacing what was there."""
    if not target.exists() and not target.is_symlink():
        partial.rename(target)
        return
    old = target.with_name(f"{target.name}.old-{os.getpid()}")
    _remove(old)
    target.rename(old)
    partial.rename(target)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _one_line(exc: object) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
