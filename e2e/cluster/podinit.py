"""Exec shim for one container, run by the node agent inside the pod's namespaces.

The agent starts ``ip netns exec <netns> unshare --uts python -m
e2e.cluster.podinit <spec.json>``: ``ip netns exec`` gives the network
namespace and a private mount namespace with the pod's hosts file over
/etc/hosts, ``unshare`` a private hostname. This shim sets the hostname,
bind-mounts the pod's volumes, then replaces itself with the container's
command (same PID), so signals from the agent reach the command directly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import TextIO


def _create(target: Path, is_dir: bool, record: TextIO) -> None:
    """Create a missing mount point, recording each new path for the harness to remove."""
    missing = [p for p in [target, *target.parents] if not p.exists()]
    if not missing:
        return
    for p in reversed(missing):
        record.write(f"{p}\n")
    record.flush()
    if is_dir:
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)


def _bind(src: str, handle: str, dst: str, read_only: bool, record: TextIO) -> None:
    """Bind-mount ``src`` (reached through ``handle``) at ``dst``, creating ``dst``.

    A missing mount point is created on the host's filesystem (an empty
    directory or file), as ip netns exec shares it; it is listed in
    ``record`` so the harness removes it when the cluster stops.
    """
    _create(Path(dst), os.path.isdir(handle), record)
    proc = subprocess.run(["mount", "--bind", handle, dst], capture_output=True, text=True)
    if proc.returncode == 0 and read_only:
        proc = subprocess.run(["mount", "-o", "remount,bind,ro", dst], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"podinit: cannot mount a volume at {dst}: {proc.stderr.strip()}")


def _refuse_mounts_over_the_image(mounts: list[list]) -> None:
    """Fail clearly when a volume would hide this checkout or its virtualenv.

    They are the pod's "image": under an emptyDir at /tmp, a checkout in /tmp
    would leave the container without its commands, failing far from the cause.
    """
    image = {"checkout": Path(__file__).resolve().parents[2], "virtualenv": Path(sys.prefix)}
    for _, dst, _ in mounts:
        for what, path in image.items():
            if path == Path(dst) or Path(dst) in path.parents:
                sys.exit(f"podinit: the volume mounted at {dst} would hide this {what} "
                         f"({path}); run the e2e tests from a checkout outside {dst}")


def main() -> None:
    """Apply the spec written by the agent and exec the container command."""
    spec = json.loads(Path(sys.argv[1]).read_text())
    socket.sethostname(spec["hostname"])
    _refuse_mounts_over_the_image(spec["mounts"])
    # Sources may live under a path a mount hides (mountPath /work over a source
    # under /work/main): open them all first, mount through /proc/<pid>/fd.
    fds = [os.open(src, os.O_PATH) for src, _, _ in spec["mounts"]]
    # The pod's scratch dir (the default working dir) may be hidden the same way.
    scratch = os.open(spec["scratch"], os.O_RDONLY | os.O_DIRECTORY)
    # And the record: an emptyDir mounted at /tmp hides a work dir under /tmp.
    with open(spec["record"], "a") as record:
        for fd, (src, dst, read_only) in zip(fds, spec["mounts"], strict=True):
            _bind(src, f"/proc/{os.getpid()}/fd/{fd}", dst, read_only, record)
    for fd in fds:
        os.close(fd)
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    else:
        os.fchdir(scratch)
    os.close(scratch)
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as exc:
        print(f"podinit: cannot run {argv[0]!r}: {exc}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main()
