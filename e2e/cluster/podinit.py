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


def _bind(src: str, dst: str, read_only: bool) -> None:
    target = Path(dst)
    if Path(src).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    subprocess.run(["mount", "--bind", src, dst], check=True)
    if read_only:
        subprocess.run(["mount", "-o", "remount,bind,ro", dst], check=True)


def main() -> None:
    """Apply the spec written by the agent and exec the container command."""
    spec = json.loads(Path(sys.argv[1]).read_text())
    socket.sethostname(spec["hostname"])
    for src, dst, read_only in spec["mounts"]:
        _bind(src, dst, read_only)
    os.chdir(spec["cwd"])
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as exc:
        print(f"podinit: cannot run {argv[0]!r}: {exc}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main()
