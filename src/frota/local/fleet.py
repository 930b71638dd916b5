"""Topology -> the local processes that run it.

`build` takes this machine's ports and devices for the topology's processes, has the
planner plan them there (`LocalAddressing`), and runs each process as planned: its
arguments and environment are the plan's, as they are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import TypeVar

from frota.api.contract import HTTP_PORT, Role, ServingPath
from frota.local.ports import free_ports, require_free
from frota.local.supervisor import GroupSpec, ProcessSpec
from frota.local.topology import LocalGroup, LocalRank, LocalTopology, UnsupportedLocally, plan
from frota.plan.addressing import LOOPBACK, MASTER_PORT, LocalAddressing
from frota.plan.runtimes import FROTA_COMMAND

# How `frota up` starts `frota worker` and `frota router`: this interpreter,
# so the fleet runs the same install as the command that started it.
DEFAULT_LAUNCHER = (sys.executable, "-m", "frota.cli.main")
T = TypeVar("T")


@dataclass(frozen=True)
class FleetOptions:
    """Where and how the local fleet runs (the `frota up` flags)."""

    host: str = "127.0.0.1"
    port: int = HTTP_PORT
    worker_base_port: int | None = None  # default: port + 1
    log_level: str = "info"
    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    cpu_threads: int | None = None  # torch threads per rank; default: cores / ranks
    vllm: str = "vllm"  # the `vllm` command the vllm runtime's workers run
    # Scale to zero: the router holds requests and POSTs here to have the workers started.
    demand_url: str | None = None
    # The fleet's key, one per run (`frota.api.fleet_key`): every process gets its path.
    fleet_key_file: str | None = None


@dataclass(frozen=True)
class LocalFleet:
    """Every process `frota up` runs, grouped for restarts; the router is its own group."""

    worker_groups: tuple[GroupSpec, ...]
    router: GroupSpec
    url: str

    @property
    def groups(self) -> list[GroupSpec]:
        return [*self.worker_groups, self.router]


def count_local_accelerators(resource: str) -> int:
    """Accelerators this machine has, of the given extended resource name."""
    if resource == "nvidia.com/gpu":
        if not shutil.which("nvidia-smi"):
            return 0
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return 0
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    if resource == "amd.com/gpu":
        return len([d for d in os.listdir("/dev/dri")
                    if d.startswith("renderD")]) if os.path.exists("/dev/kfd") else 0
    return 0


def build(topology: LocalTopology, opts: FleetOptions) -> LocalFleet:
    """Take ports and devices, plan the processes on them and build each one; raise on what
    cannot run here."""
    require_free(opts.port, opts.host, "router")
    sizes = [len(g.ranks) for g in topology.groups]
    if not sum(sizes):
        raise UnsupportedLocally("spec.replicas is 0: there is nothing to serve (set replicas: 1)")
    placed = plan(topology.isvc, _take_addresses(topology, sizes, opts))
    worker_groups = [GroupSpec(g.name, tuple(_process(g, r, opts) for r in g.ranks))
                     for g in placed.groups]
    router = _router_spec(placed, worker_groups, opts)
    return LocalFleet(tuple(worker_groups), GroupSpec("router", (router,)),
                      url=f"http://{_connect_host(opts.host)}:{opts.port}")


def _take_addresses(topology: LocalTopology, sizes: list[int], opts: FleetOptions) -> LocalAddressing:
    """The ports, devices and CPU share of each of the processes (`sizes`: per group)."""
    count = sum(sizes)
    devices = _assign_devices(topology, count)
    base = opts.worker_base_port or opts.port + 1
    http_ports = free_ports(count, base, opts.host, exclude=[opts.port])
    # torch.distributed rendezvous, one per group, in torch's usual range.
    master_ports = free_ports(len(sizes), MASTER_PORT, LOOPBACK, exclude=[opts.port, *http_ports])
    # A CPU request is a floor, not a cap (as in Kubernetes without limits): the
    # ranks share this machine's cores instead of each taking all of them.
    threads = opts.cpu_threads or max(1, (os.cpu_count() or 1) // count)
    return LocalAddressing(
        host=opts.host, http_ports=_by_group(http_ports, sizes), master_ports=tuple(master_ports),
        devices=None if devices is None else _by_group(devices, sizes), threads=threads,
        log_level=opts.log_level, fleet_key_file=opts.fleet_key_file)


def _by_group(flat: list[T], sizes: list[int]) -> tuple[tuple[T, ...], ...]:
    """`flat`, one item per process in order, cut into the groups' processes."""
    items = iter(flat)
    return tuple(tuple(next(items) for _ in range(size)) for size in sizes)


def _process(group: LocalGroup, rank: LocalRank, opts: FleetOptions) -> ProcessSpec:
    """One worker process as planned; its group's rank 0 is the one probed."""
    url = f"http://{_connect_host(opts.host)}:{rank.port}"
    is_leader = rank.rank == 0
    return ProcessSpec(
        name=group.name if len(group.ranks) == 1 else f"{group.name}.{rank.rank}",
        argv=(*local_command(rank, opts), *rank.args), env=rank.env, port=rank.port,
        role=group.role, replica=group.replica, rank=rank.rank,
        ready_url=f"{url}{group.ready_path}" if is_leader else None,
        live_url=f"{url}{group.live_path}" if is_leader else None,
    )


def local_command(rank: LocalRank, opts: FleetOptions) -> tuple[str, ...]:
    """The program on this machine for the server an image names (`frota`, `vllm serve`)."""
    if rank.command == FROTA_COMMAND:
        return opts.launcher
    if rank.command[0] == "vllm":
        return (opts.vllm, *rank.command[1:])
    return rank.command


def leader_url(group: GroupSpec, host: str) -> str:
    """The HTTP address of a group's rank 0 (the one the router talks to)."""
    leader = group.processes[0]
    return f"http://{_connect_host(host)}:{leader.port}"


def _router_spec(topology: LocalTopology, groups: list[GroupSpec], opts: FleetOptions) -> ProcessSpec:
    # Workers by role: prefill ranks get their own pool; decode and colocated ones the main pool.
    by_role: dict[str, list[str]] = {}
    for g in groups:
        by_role.setdefault(g.processes[0].role, []).append(leader_url(g, opts.host))
    pools = [(flag, ",".join(by_role[role])) for flag, role in (
        ("--workers", Role.WORKER), ("--prefill-workers", Role.PREFILL), ("--decode-workers", Role.DECODE))
        if by_role.get(role)]
    hold: tuple[str, ...] = ()
    if opts.demand_url is not None:
        hold = ("--demand-url", opts.demand_url)
        if "--hold-seconds" not in topology.router_args:  # --scale-to-zero on a plain manifest
            hold += topology.hold_args
    argv = (*opts.launcher, "router", *(x for pool in pools for x in pool), *topology.router_args,
            *hold, "--host", opts.host, "--port", str(opts.port))
    return ProcessSpec(
        name="router", argv=argv, env=dict(topology.router_env), port=opts.port,
        role=Role.ROUTER, ready_url=f"http://{_connect_host(opts.host)}:{opts.port}{ServingPath.READY}",
        live_url=f"http://{_connect_host(opts.host)}:{opts.port}{ServingPath.HEALTH}",
    )


def _assign_devices(topology: LocalTopology, num_ranks: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES per rank, or None to leave it alone; CPU fleets see no GPU."""
    if not topology.accelerators_per_rank:
        return [""] * num_ranks  # the manifest says CPU: keep torch off any GPU here
    resource = topology.accelerator_resource or "nvidia.com/gpu"
    have = count_local_accelerators(resource)
    need = topology.accelerators_per_rank * num_ranks
    if have < need:
        raise UnsupportedLocally(
            f"the manifest asks for {need} {resource} ({topology.accelerators_per_rank} per rank x "
            f"{num_ranks} ranks) and this machine has {have}; remove spec.resources.accelerator "
            "to run on CPU"
        )
    if resource != "nvidia.com/gpu":
        return None
    per = topology.accelerators_per_rank
    return [",".join(str(i * per + j) for j in range(per)) for i in range(num_ranks)]


def _connect_host(host: str) -> str:
    """Where a client on this machine connects to a server bound on `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
