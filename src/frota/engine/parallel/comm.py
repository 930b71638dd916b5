"""Joining the process group and the collectives the model uses, each one timed.

gloo on CPU, NCCL on CUDA. Every collective carries the group timeout, so a dead
peer surfaces as an exception within `timeout_s` instead of a hang. Time spent
inside collectives accumulates in `CommStats`, which the benchmark and the
runner read (`comm_fraction` = collective time / step time).
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from frota.engine.parallel.config import ParallelConfig, ParallelConfigError

SETUP_TIMEOUT_S = 600.0  # ranks of one group start (and load) within this time of each other


@dataclass
class CommStats:
    """Seconds spent in collectives and in pipeline waits, since the last reset."""

    collective_s: float = 0.0
    bubble_s: float = 0.0  # pipeline: waiting for the previous stage's activations
    step_s: float = 0.0
    num_steps: int = 0
    bytes: int = 0
    by_kind: dict[str, float] = field(default_factory=dict)
    record_history: bool = False  # benchmarks: keep (step_s, collective_s, bubble_s) per step
    history: list[tuple[float, float, float]] = field(default_factory=list)

    def reset(self) -> None:
        self.collective_s = self.bubble_s = self.step_s = 0.0
        self.num_steps = self.bytes = 0
        self.by_kind.clear()
        self.history.clear()


class Comm:
    """This rank's process groups: the world, its stage's tensor group, and p2p to neighbours."""

    def __init__(self, pc: ParallelConfig, device: torch.device) -> None:
        self.pc = pc
        self.device = device
        self.stats = CommStats()
        self.tp_group = None
        self.world_group = None

    def join(self) -> None:
        """Rendezvous at master_addr:master_port; create one tensor group per stage."""
        pc = self.pc
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=pc.timeout_s)
        store = dist.TCPStore(pc.master_addr, pc.master_port, pc.world_size, pc.rank == 0,
                              timeout=timedelta(seconds=SETUP_TIMEOUT_S))
        dist.init_process_group(backend, store=store, rank=pc.rank, world_size=pc.world_size,
                                timeout=timeout)
        self.world_group = dist.group.WORLD
        # Joining and loading take as long as the slowest rank's load: a patient group for
        # those two exchanges, so the short timeout only ever measures a step.
        self.setup_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=SETUP_TIMEOUT_S))
        # A CPU-side group for object broadcasts, so NCCL ranks never pickle onto the GPU.
        self.cpu_group = self.world_group if backend == "gloo" else dist.new_group(
            backend="gloo", timeout=timeout)
        for stage in range(pc.pipeline):
            ranks = pc.stage_ranks(stage)
            group = dist.new_group(ranks, timeout=timeout) if pc.pipeline > 1 else self.world_group
            if stage == pc.stage:
                self.tp_group = group

    def check_same(self, fingerprint: dict) -> None:
        """All ranks must run the same model and sizes; a mismatch names the first difference."""
        gathered: list = [None] * self.pc.world_size
        dist.all_gather_object(gathered, fingerprint, group=self.setup_group)
        for rank, other in enumerate(gathered):
            if other != fingerprint:
                diff = sorted(k for k in set(other) | set(fingerprint)
                              if other.get(k) != fingerprint.get(k))
                raise ParallelConfigError(
                    f"rank {self.pc.rank} and rank {rank} were started with different configs "
                    f"({', '.join(diff)}: {[fingerprint.get(k) for k in diff]} vs "
                    f"{[other.get(k) for k in diff]}); every rank needs the same flags")

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.setup_group)
        return int(t.item())

    # -- timed collectives ---------------------------------------------------------------

    def _timed(self, kind: str, t0: float, nbytes: int) -> None:
        dt = time.perf_counter() - t0
        self.stats.collective_s += dt
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0.0) + dt
        self.stats.bytes += nbytes

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the tensor group, in place."""
        if self.pc.tensor == 1:
            return x
        t0 = time.perf_counter()
        dist.all_reduce(x, group=self.tp_group)
        self._timed("all_reduce", t0, x.numel() * x.element_size())
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate the tensor group's shards along the last dimension."""
        if self.pc.tensor == 1:
            return x
        t0 = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.pc.tensor)]
        dist.all_gather(parts, x.contiguous(), group=self.tp_group)
        self._timed("all_gather", t0, x.numel() * x.element_size() * self.pc.tensor)
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj: object = None) -> object:
        """Rank 0's object to every rank (pickled; the step inputs are small)."""
        t0 = time.perf_counter()
        if self.pc.rank == 0:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            size = torch.tensor([len(data)], dtype=torch.long)
        else:
            size = torch.zeros(1, dtype=torch.long)
        dist.broadcast(size, 0, group=self.cpu_group)
        if self.pc.rank == 0:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buf, 0, group=self.cpu_group)
        self._timed("broadcast", t0, buf.numel())
        return obj if self.pc.rank == 0 else pickle.loads(buf.numpy().tobytes())

    def send(self, x: torch.Tensor, dst: int) -> dist.Work:
        """Asynchronous point-to-point send; the caller waits on the handle before reuse."""
        t0 = time.perf_counter()
        handle = dist.isend(x.contiguous(), dst)
        self._timed("send", t0, x.numel() * x.element_size())
        return handle

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        """Blocking receive; the wait counts as pipeline bubble (idle while the peer computes)."""
        x = torch.empty(shape, dtype=dtype, device=self.device)
        t0 = time.perf_counter()
        dist.recv(x, src)
        self.stats.bubble_s += time.perf_counter() - t0
        return x

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
