"""Local ports: is one free, and which free ones follow it."""

from __future__ import annotations

import socket
from collections.abc import Iterable


class PortInUseError(RuntimeError):
    """A port `frota up` was told to use is taken."""


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on host:port now.

    SO_REUSEADDR matches what the servers set, so a port that only has
    connections in TIME_WAIT (a fleet that just stopped) counts as free.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free(port: int, host: str, what: str) -> None:
    """Raise PortInUseError with one line that says what to do."""
    if not 0 < port < 65536:
        raise PortInUseError(f"{what} port {port} is not a valid TCP port (1-65535)")
    if not is_port_free(port, host):
        raise PortInUseError(
            f"port {port} on {host} is in use ({what}); stop what holds it "
            f"(another `frota up`? see `frota status`) or pick another with --port"
        )


def free_ports(count: int, start: int, host: str = "127.0.0.1",
               exclude: Iterable[int] = ()) -> list[int]:
    """The first `count` free ports at or after `start`, skipping `exclude`."""
    taken = set(exclude)
    found: list[int] = []
    port = start
    while len(found) < count:
        if port >= 65536:
            raise PortInUseError(f"no {count} free ports at or above {start} on {host}")
        if port not in taken and is_port_free(port, host):
            found.append(port)
        port += 1
    return found


def any_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (for a loopback server of `frota up`'s own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
