"""The state file `frota up` keeps while it runs, so `frota status` can find the fleet.

One JSON file per fleet, named for the router port:
`$XDG_RUNTIME_DIR/frota/up-<port>.json`, or `~/.cache/frota/up-<port>.json`
where there is no runtime directory. `FROTA_STATE_DIR` overrides the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from frota.api.contract import ServingPath
from frota.api.fleet_key import write_key_file


@dataclass
class ProcessState:
    """One process of the fleet as `frota status` sees it."""

    name: str
    role: str
    replica: int | None
    rank: int
    pid: int | None
    port: int | None
    url: str | None  # its HTTP address, for ranks that serve one (rank 0 and the router)
    ready_path: str = ServingPath.READY  # its readiness probe under `url` (vLLM's server: /health)
    is_ready: bool = False
    num_restarts: int = 0


@dataclass
class FleetState:
    """A running `frota up`: who it is, where it serves, and its processes."""

    name: str
    model: str
    url: str
    port: int
    pid: int = field(default_factory=os.getpid)
    started_at: float = field(default_factory=time.time)
    processes: list[ProcessState] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FleetState:
        procs = [ProcessState(**p) for p in data.pop("processes", [])]
        return cls(**data, processes=procs)


def state_dir() -> Path:
    """Where state files live."""
    if override := os.environ.get("FROTA_STATE_DIR"):
        return Path(override)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "frota"
    return Path.home() / ".cache" / "frota"


def state_path(port: int) -> Path:
    return state_dir() / f"up-{port}.json"


def fleet_key_path(port: int) -> Path:
    """The fleet key of the fleet on `port` (readable by its owner only)."""
    return state_dir() / f"fleet-key-{port}"


def write_fleet_key(port: int) -> Path:
    """A new fleet key for the fleet on `port`, replacing any earlier run's."""
    path = fleet_key_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_key_file(path)


def write(state: FleetState) -> Path:
    """Write atomically (a reader never sees half a file)."""
    path = state_path(state.port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(path)
    return path


def remove(port: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(port).unlink()


def read_all() -> list[FleetState]:
    """Every fleet whose `frota up` is still alive; stale files are removed."""
    fleets = []
    for path in sorted(state_dir().glob("up-*.json")):
        try:
            state = FleetState.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if not _is_alive(state.pid):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        fleets.append(state)
    return fleets


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
