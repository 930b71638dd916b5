"""Where a plan's ranks run: pods in a cluster, or processes on one machine.

The planner asks the addressing for every address and port it writes into a rank's
flags and environment, so one planner serves the operator and `frota up`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

WORKER_PORT = 8000
MASTER_PORT = 29500


class Addressing(Protocol):
    """Where ranks find each other and listen: DNS names in a cluster, ports on localhost."""

    def master_addr(self, group_name: str) -> str: ...
    def master_port(self, group_ordinal: int) -> int: ...
    def http_port(self, group_ordinal: int, rank: int) -> int: ...


@dataclass(frozen=True)
class KubernetesAddressing:
    """Rank 0 of group G is pod G-0 behind the headless Service G; every pod uses the same ports."""

    def master_addr(self, group_name: str) -> str:
        return f"{group_name}-0.{group_name}"

    def master_port(self, group_ordinal: int) -> int:
        return MASTER_PORT

    def http_port(self, group_ordinal: int, rank: int) -> int:
        return WORKER_PORT


@dataclass(frozen=True)
class LocalAddressing:
    """All ranks on one host: each group gets its own master port and a block of HTTP ports."""

    host: str = "127.0.0.1"
    base_http_port: int = 8100
    base_master_port: int = 29500
    ports_per_group: int = 64

    def master_addr(self, group_name: str) -> str:
        return self.host

    def master_port(self, group_ordinal: int) -> int:
        return self.base_master_port + group_ordinal

    def http_port(self, group_ordinal: int, rank: int) -> int:
        return self.base_http_port + group_ordinal * self.ports_per_group + rank
