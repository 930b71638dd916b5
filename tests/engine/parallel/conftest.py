"""Multi-process helpers: each rank is a real OS process joined over gloo on 127.0.0.1.

One intra-op thread per rank (OMP_NUM_THREADS=1), as tests/engine/conftest.py sets for this
process: the machine is small and shared, and OpenMP threads spinning against each other make
collectives look tens of times slower.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

RANK_MAIN = Path(__file__).with_name("rank_main.py")
RANK_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROTA_")}
    env.update(FROTA_RANK=str(rank), FROTA_WORLD_SIZE=str(world), FROTA_MASTER_ADDR="127.0.0.1",
               FROTA_MASTER_PORT=str(port), OMP_NUM_THREADS="1", FROTA_COLLECTIVE_TIMEOUT="60",
               **extra)
    return env


def run_ranks(argv: list[str], envs: list[dict[str, str]]) -> list[subprocess.CompletedProcess]:
    """Run `argv` once per rank environment, all at once; when one rank outlives
    RANK_TIMEOUT_S every rank is killed. Each outcome holds its rank's merged output."""
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for env in envs]
    outcomes = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=RANK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
        outcomes.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    return outcomes


def run_group(tmp_path: Path, model: str, tp: int = 1, pp: int = 1, ep: int = 1, num: int = 8,
              max_tokens: int = 32, env_by_rank: dict[int, dict[str, str]] | None = None,
              ) -> tuple[dict | None, list[subprocess.CompletedProcess]]:
    """Start tp x pp rank processes; return rank 0's result and every rank's outcome."""
    world = tp * pp
    port = free_port()
    argv = [sys.executable, str(RANK_MAIN), str(tmp_path), model, str(tp), str(pp), str(ep),
            str(num), str(max_tokens)]
    envs = [rank_env(rank, world, port, **(env_by_rank or {}).get(rank, {})) for rank in range(world)]
    outcomes = run_ranks(argv, envs)
    path = tmp_path / "result.pt"
    return (torch.load(path) if path.exists() else None), outcomes


@pytest.fixture(scope="session")
def reference():
    """Single-process results, computed once per model in this process."""
    from tests.engine.parallel.rank_main import generate

    cache: dict[str, dict] = {}

    def get(model: str) -> dict:
        if model not in cache:
            cache[model] = generate(model)
        return cache[model]

    return get
