"""Pod networking for the node agent: a host bridge and one netns per pod.

Every pod gets a network namespace ``frota-<n>`` with a veth pair into the
bridge ``frota0`` (10.244.0.1/24 on the host), its own IP from that /24 and a
default route via the bridge. IP forwarding is not touched, so traffic from a
pod reaches only the host and the other pods. Name resolution inside a pod is
a hosts file at ``/etc/netns/<netns>/hosts``, which ``ip netns exec``
bind-mounts over ``/etc/hosts`` for the processes it starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

BRIDGE = "frota0"
SUBNET_PREFIX = "10.244.0."
GATEWAY = SUBNET_PREFIX + "1"
NETNS_PREFIX = "frota-"
ETC_NETNS = Path("/etc/netns")
# Inside a pod no DNS server answers: lookups fall back to the hosts file
# and fail fast instead of going to the host's resolver.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """Why pod networking cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "pod networking needs root (network namespaces, veth, bridge)"
    for tool, pkg in (("ip", "iproute2"), ("openssl", "openssl"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"the `{tool}` command is missing: apt-get install -y {pkg}"
    return None


def ensure_host_tools() -> None:
    """apt-get install what the harness runs when missing (root on a fresh machine).

    iproute2 (``ip``), openssl (the PKI) and util-linux (``unshare``,
    ``nsenter``, ``mount``).
    """
    wanted = {"ip": "iproute2", "openssl": "openssl", "unshare": "util-linux",
              "nsenter": "util-linux", "mount": "mount"}
    missing = sorted({pkg for tool, pkg in wanted.items() if shutil.which(tool) is None})
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env, check=False)


def ensure_bridge() -> None:
    """Create the host bridge with the gateway address (idempotent)."""
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    addrs = _ip("-o", "addr", "show", "dev", BRIDGE).stdout
    if f"{GATEWAY}/24" not in addrs:
        _ip("addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def create_pod_netns(index: int, hosts: str) -> tuple[str, str]:
    """Create netns ``frota-<index>`` with IP 10.244.0.<index>; return (netns, ip)."""
    if not 2 <= index <= 254:
        raise ValueError(f"pod network index {index} out of range 2..254")
    name, ip = f"{NETNS_PREFIX}{index}", f"{SUBNET_PREFIX}{index}"
    delete_pod_netns(name)
    host_if, peer_if = f"fv{index}", f"fv{index}p"
    etc = ETC_NETNS / name
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(hosts)
    (etc / "resolv.conf").write_text(RESOLV_CONF)
    _ip("netns", "add", name)
    _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
    _ip("link", "set", peer_if, "netns", name)
    _ip("link", "set", host_if, "master", BRIDGE, "up")
    for args in (
        ("link", "set", peer_if, "name", "eth0"),
        ("addr", "add", f"{ip}/24", "dev", "eth0"),
        ("link", "set", "eth0", "up"),
        ("link", "set", "lo", "up"),
        ("route", "add", "default", "via", GATEWAY),
    ):
        _ip("-n", name, *args)
    return name, ip


def write_hosts(netns: str, hosts: str) -> None:
    """Rewrite a pod's hosts file in place (bind mounts pin the inode)."""
    path = ETC_NETNS / netns / "hosts"
    if not path.exists():
        return
    if path.read_text() != hosts:
        with path.open("r+") as f:
            f.write(hosts)
            f.truncate()


def kill_netns_processes(name: str) -> None:
    """SIGKILL every process still inside a netns."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def delete_pod_netns(name: str) -> None:
    """Kill what runs in a pod netns, then remove it, its veth and its /etc files."""
    if _ip("netns", "pids", name, check=False).returncode == 0:
        kill_netns_processes(name)
        _ip("netns", "del", name, check=False)
    index = name.removeprefix(NETNS_PREFIX)
    _ip("link", "del", f"fv{index}", check=False)
    shutil.rmtree(ETC_NETNS / name, ignore_errors=True)


def cleanup_all_pods() -> None:
    """Remove every frota pod netns (killing what runs there), its veth and /etc files."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return
    names = [
        line.split()[0]
        for line in _ip("netns", "list", check=False).stdout.splitlines()
        if line.startswith(NETNS_PREFIX)
    ]
    for name in names:
        delete_pod_netns(name)
    if ETC_NETNS.exists():
        for d in ETC_NETNS.glob(f"{NETNS_PREFIX}*"):
            shutil.rmtree(d, ignore_errors=True)


def remove_created_paths(record: Path) -> None:
    """Remove the empty mount points listed in ``record`` (deepest first), then the list."""
    if not record.exists():
        return
    for line in sorted(set(record.read_text().splitlines()), key=len, reverse=True):
        p = Path(line)
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_mount():
                p.rmdir()  # only when empty
            elif p.is_file() and p.stat().st_size == 0:
                p.unlink()
    record.unlink()


def cleanup_all() -> None:
    """Remove every pod netns and the bridge."""
    cleanup_all_pods()
    if shutil.which("ip") is not None and os.geteuid() == 0:
        _ip("link", "del", BRIDGE, check=False)
