"""Topology -> the local processes that run it: ports, rank env, devices, argv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from frota.api.contract import FleetKey, Role
from frota.local.ports import free_ports, require_free
from frota.local.supervisor import GroupSpec, ProcessSpec
from frota.local.topology import (
    LocalGroup,
    LocalRank,
    LocalTopology,
    UnsupportedLocally,
    strip_flags,
)
from frota.plan.runtimes import FROTA_COMMAND

# How `frota up` starts `frota worker` and `frota router`: this interpreter,
# so the fleet runs the same install as the command that started it.
DEFAULT_LAUNCHER = (sys.executable, "-m", "frota.cli.main")
MASTER_PORT_BASE = 29500


@dataclass(frozen=True)
class FleetOptions:
    """Where and how the local fleet runs (the `frota up` flags)."""

    host: str = "127.0.0.1"
    port: int = 8000
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
    """Assign ports and devices and build every process; raise on what cannot run here."""
    require_free(opts.port, opts.host, "router")
    ranks = [(g, r) for g in topology.groups for r in g.ranks]
    if not ranks:
        raise UnsupportedLocally("spec.replicas is 0: there is nothing to serve (set replicas: 1)")
    devices = _assign_devices(topology, len(ranks))
    base = opts.worker_base_port or opts.port + 1
    rank_ports = free_ports(len(ranks), base, opts.host, exclude=[opts.port])
    # torch.distributed rendezvous, one per group, in torch's usual range.
    master_ports = free_ports(len(topology.groups), MASTER_PORT_BASE, "127.0.0.1",
                              exclude=[opts.port, *rank_ports])
    # A CPU request is a floor, not a cap (as in Kubernetes without limits): the
    # ranks share this machine's cores instead of each taking all of them.
    threads = opts.cpu_threads or max(1, (os.cpu_count() or 1) // len(ranks))

    worker_groups = []
    index = 0
    for group_index, group in enumerate(topology.groups):
        procs = []
        for rank in group.ranks:
            port = rank_ports[index]
            env = {**rank.env, **_rank_env(group, rank.rank, master_ports[group_index], opts,
                                            threads)}
            if devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices[index]
            env.update(_fleet_key_env(opts))
            argv = (*local_command(rank, opts), *strip_flags(rank.args, {"--port", "--host"}),
                    "--host", opts.host, "--port", str(port))
            is_leader = rank.rank == 0
            procs.append(ProcessSpec(
                name=group.name if len(group.ranks) == 1 else f"{group.name}.{rank.rank}",
                argv=argv, env=env, port=port, role=group.role, replica=group.replica,
                rank=rank.rank,
                ready_url=f"http://{_connect_host(opts.host)}:{port}{group.ready_path}" if is_leader else None,
                live_url=f"http://{_connect_host(opts.host)}:{port}{group.live_path}" if is_leader else None,
            ))
            index += 1
        worker_groups.append(GroupSpec(group.name, tuple(procs)))

    router = _router_spec(topology, worker_groups, opts)
    return LocalFleet(tuple(worker_groups), GroupSpec("router", (router,)),
                      url=f"http://{_connect_host(opts.host)}:{opts.port}")


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
    argv = (*opts.launcher, "router", *(x for pool in pools for x in pool),
            *strip_flags(topology.router_args, {"--port", "--host", "--workers",
                                                 "--prefill-workers", "--decode-workers"}),
            *hold, "--host", opts.host, "--port", str(opts.port))
    return ProcessSpec(
        name="router", argv=argv,
        env={**topology.router_env, "FROTA_LOG_LEVEL": opts.log_level, **_fleet_key_env(opts)},
        port=opts.port,
        role=Role.ROUTER, ready_url=f"http://{_connect_host(opts.host)}:{opts.port}/ready",
        live_url=f"http://{_connect_host(opts.host)}:{opts.port}/health",
    )


def _fleet_key_env(opts: FleetOptions) -> dict[str, str]:
    return {FleetKey.FILE_ENV: opts.fleet_key_file} if opts.fleet_key_file else {}


def _rank_env(group: LocalGroup, rank: int, master_port: int, opts: FleetOptions,
              threads: int) -> dict[str, str]:
    world = str(len(group.ranks))
    env = {
        "FROTA_RANK": str(rank), "FROTA_WORLD_SIZE": world,
        "FROTA_MASTER_ADDR": "127.0.0.1", "FROTA_MASTER_PORT": str(master_port),
        "RANK": str(rank), "WORLD_SIZE": world, "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "FROTA_LOG_LEVEL": opts.log_level,
        "OMP_NUM_THREADS": str(threads),
    }
    return env


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
