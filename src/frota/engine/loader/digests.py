"""sha256 of model files, as fast as hashlib goes: what the model cache records at the first
download and checks at every pod start and every load (`cache_manifest`).

A file is read in READ_BYTES pieces into one reused buffer (no allocation per piece), and
files are hashed on up to MAX_THREADS threads at once: hashlib releases the GIL while it
hashes a large buffer, so a sharded checkpoint is hashed on several cores. A single file
is one stream: sha256 cannot be split. The threads and buffers are few and small on
purpose: `frota cache wait` runs in an init container with 256 MiB of memory.

The digest of a directory (what spec.model.sha256 names for an `hf://` repository or a
directory URL) is the sha256 of `sha256sum`'s output over its files, sorted by path:
`<hex>  <path>\\n` per file, the path relative to the directory, `/`-separated. So it can
be computed without Frota, and `frota cache digest DIR` prints it.

Torch-free: the `frota` command's init containers import it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

READ_BYTES = 8 << 20
MAX_THREADS = 4


class RefusedFile(Exception):
    """A link, a device or a socket where a model's files are (never followed or read), or
    a file name the directory's digest cannot write as one line."""


def file_sha256(path: Path) -> str:
    """The hex sha256 of the regular file `path` (a link is refused, not followed)."""
    digest = hashlib.sha256()
    buffer = bytearray(READ_BYTES)
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RefusedFile(f"{path} is not a regular file")
        if hasattr(os, "posix_fadvise"):  # a larger readahead: the whole file is read once, in order
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        with open(fd, "rb", buffering=0, closefd=False) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
    finally:
        os.close(fd)
    return digest.hexdigest()


def files_sha256(paths: Sequence[Path], threads: int = MAX_THREADS) -> list[str]:
    """The hex sha256 of each of `paths`, in order, hashed on up to `threads` threads."""
    workers = max(1, min(threads, len(paths)))
    if workers == 1:
        return [file_sha256(p) for p in paths]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sha256") as pool:
        return list(pool.map(file_sha256, paths))


def regular_files(top: Path) -> list[Path]:
    """Every file under the directory `top` (or `top` itself, a file), sorted; links and
    special files raise RefusedFile: a model's files are plain files, and a link could
    point the loader anywhere on the node."""
    mode = os.lstat(top).st_mode
    if stat.S_ISREG(mode):
        return [top]
    if not stat.S_ISDIR(mode):
        raise RefusedFile(f"{top} is a link or a special file")
    found: list[Path] = []
    for directory, dirs, files in os.walk(top, onerror=_raise):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                found.append(path)
            elif not stat.S_ISDIR(mode):
                raise RefusedFile(f"{path} is a link or a special file")
    return sorted(found)


def tree_sha256(digests: Mapping[str, str]) -> str:
    """The digest of a directory from its files' (relative `/` path -> hex sha256): the
    sha256 of `sha256sum`'s lines for them, sorted by path."""
    return hashlib.sha256(sha256sum_lines(digests.items()).encode()).hexdigest()


def sha256sum_lines(digests: Iterable[tuple[str, str]]) -> str:
    """`sha256sum`'s output for these files. A name with a newline or a backslash (which
    `sha256sum` escapes) is refused: one name could then read as two lines, and two
    different trees would share a digest."""
    lines = []
    for name, digest in sorted(digests):
        if any(c in name for c in "\n\r\\"):
            raise RefusedFile(f"{name!r}: a file name with a newline or a backslash is refused")
        lines.append(f"{digest}  {name}\n")
    return "".join(lines)


def _raise(error: OSError) -> None:
    raise error
