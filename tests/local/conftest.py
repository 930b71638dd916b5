"""Fixtures for the local-fleet tests: free ports and helpers that wait on conditions."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CHILD = str(HERE / "child_server.py")


def free_port() -> int:
    """A port the kernel says is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> object:
    """Poll `condition` until it is truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def child_argv(port: int, *extra: str) -> tuple[str, ...]:
    """argv of the trivial HTTP child process."""
    return (sys.executable, CHILD, str(port), *extra)
