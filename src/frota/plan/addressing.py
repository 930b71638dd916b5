"""Where a plan's ranks run: pods in a cluster, or processes on one machine.

The planner and the runtimes ask the addressing for every address, port and placement
fact they write into a rank's flags and environment, so a Topology is complete for
where it runs: the builders render a cluster's into pods, and `frota up` runs one
machine's processes as they are planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from frota.api.contract import HTTP_PORT, Env, FleetKey

WORKER_PORT = HTTP_PORT
MASTER_PORT = 29500
#: Where the ranks of a group on one machine meet (torch.distributed's rendezvous).
LOOPBACK = "127.0.0.1"
#: The flags that say where a server listens.
LISTEN_FLAGS = frozenset({"--host", "--port"})


class Addressing(Protocol):
    """Where ranks find each other and listen, and what a process is told of where it runs."""

    @property
    def one_machine(self) -> bool:
        """Every rank of a group runs on one machine (vLLM then runs a group as one server)."""
        ...

    @property
    def fleet_env(self) -> dict[str, str]:
        """What every process of the fleet is given, the router included."""
        ...

    def master_addr(self, group_name: str) -> str: ...
    def master_port(self, group_ordinal: int) -> int: ...
    def http_port(self, group_ordinal: int, rank: int) -> int: ...

    def server_args(self, head: Sequence[str], listen: Sequence[str], tail: Sequence[str],
                    port: int) -> tuple[str, ...]:
        """A server's flags: `head`, then where it listens, then `tail` (which ends with the
        spec's own flags). `listen`: the runtime's flags for listening on `port` in a pod."""
        ...

    def process_env(self, group_ordinal: int, rank: int, num_processes: int) -> dict[str, str]:
        """What one of a group's `num_processes` processes is told of where it runs, over
        every other variable it gets."""
        ...


@dataclass(frozen=True)
class KubernetesAddressing:
    """Rank 0 of group G is pod G-0 behind the headless Service G; every pod uses the same
    ports. What a pod learns of where it runs (its index, the fleet key) the builders
    render from the pod itself."""

    @property
    def one_machine(self) -> bool:
        return False

    @property
    def fleet_env(self) -> dict[str, str]:
        return {}

    def master_addr(self, group_name: str) -> str:
        return f"{group_name}-0.{group_name}"

    def master_port(self, group_ordinal: int) -> int:
        return MASTER_PORT

    def http_port(self, group_ordinal: int, rank: int) -> int:
        return WORKER_PORT

    def server_args(self, head: Sequence[str], listen: Sequence[str], tail: Sequence[str],
                    port: int) -> tuple[str, ...]:
        return (*head, *listen, *tail)

    def process_env(self, group_ordinal: int, rank: int, num_processes: int) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class LocalAddressing:
    """Every rank a process on this machine (`frota up`), at the ports it has taken: one per
    process, and a rendezvous port per group on loopback; with what it gives each process
    (threads, devices, log level, the run's fleet key).

    Without ports (the default) every port is 0: such a plan says which processes run,
    and `frota up` takes a port for each before it plans them on those ports.
    """

    host: str = LOOPBACK  # where the servers listen
    http_ports: tuple[tuple[int, ...], ...] = ()  # [group ordinal][rank]
    master_ports: tuple[int, ...] = ()  # [group ordinal]
    # CUDA_VISIBLE_DEVICES of each process, [group ordinal][rank]; None leaves it alone.
    devices: tuple[tuple[str, ...], ...] | None = None
    threads: int = 1  # OMP_NUM_THREADS of each rank: the ranks share the machine's cores
    log_level: str = "info"
    fleet_key_file: str | None = None  # the run's key (`frota.api.fleet_key`)

    @property
    def one_machine(self) -> bool:
        return True

    @property
    def fleet_env(self) -> dict[str, str]:
        env = {"FROTA_LOG_LEVEL": self.log_level}
        if self.fleet_key_file:
            env[FleetKey.FILE_ENV] = self.fleet_key_file
        return env

    def master_addr(self, group_name: str) -> str:
        return LOOPBACK

    def master_port(self, group_ordinal: int) -> int:
        return self.master_ports[group_ordinal] if self.master_ports else 0

    def http_port(self, group_ordinal: int, rank: int) -> int:
        return self.http_ports[group_ordinal][rank] if self.http_ports else 0

    def server_args(self, head: Sequence[str], listen: Sequence[str], tail: Sequence[str],
                    port: int) -> tuple[str, ...]:
        """`frota up` owns the machine's ports: its host and port come last, and a --host
        or --port among the spec's flags is dropped."""
        return (*head, *without_flags(tail, LISTEN_FLAGS), "--host", self.host, "--port", str(port))

    def process_env(self, group_ordinal: int, rank: int, num_processes: int) -> dict[str, str]:
        """The rank among the group's processes and where they meet (in Frota's names and
        torch.distributed's), the process's share of the machine, and the fleet's env."""
        index, world, port = str(rank), str(num_processes), str(self.master_port(group_ordinal))
        env = {
            Env.RANK: index, Env.WORLD_SIZE: world,
            Env.MASTER_ADDR: LOOPBACK, Env.MASTER_PORT: port,
            Env.TORCH_RANK: index, Env.TORCH_WORLD_SIZE: world, Env.TORCH_LOCAL_RANK: index,
            Env.TORCH_MASTER_ADDR: LOOPBACK, Env.TORCH_MASTER_PORT: port,
            "OMP_NUM_THREADS": str(self.threads),
        }
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices[group_ordinal][rank]
        return {**env, **self.fleet_env}


def without_flags(args: Sequence[str], flags: frozenset[str]) -> tuple[str, ...]:
    """`args` without each `--flag value` and `--flag=value` of `flags`."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = True
            continue
        if arg.split("=", 1)[0] in flags:
            continue
        out.append(arg)
    return tuple(out)
