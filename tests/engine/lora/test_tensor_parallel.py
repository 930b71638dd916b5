"""Tensor parallelism with adapters: two ranks (A and B sharded as their projections are,
the row-parallel partial deltas summed by the projection's all-reduce) give the single
process's tokens, while slots are rewritten mid-run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.engine.lora import synthetic
from tests.engine.lora.tp_rank_main import generate
from tests.engine.parallel.conftest import free_port, rank_env, run_ranks

RANK_MAIN = Path(__file__).with_name("tp_rank_main.py")
ROOT = Path(__file__).resolve().parents[3]
# the ranks import `tests` from the checkout, and frota from where this process does
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory) -> list[str]:
    loaded = synthetic.load()
    dirs = synthetic.make_adapters(tmp_path_factory.mktemp("adapters"), loaded[1], count=3)
    return [str(p) for p in dirs.values()]


def test_tp2_with_adapters_gives_the_single_process_tokens(tmp_path, adapter_dirs):
    want = generate(1, adapter_dirs)
    port = free_port()
    outcomes = run_ranks([sys.executable, str(RANK_MAIN), str(tmp_path), "2", *adapter_dirs],
                         [{**rank_env(rank, 2, port), "PYTHONPATH": PYTHONPATH} for rank in range(2)])
    assert all(o.returncode == 0 for o in outcomes), "\n".join(o.stdout[-3000:] for o in outcomes)
    assert json.loads((tmp_path / "result.json").read_text()) == want
