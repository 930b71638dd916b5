"""A real `frota worker` group: two processes serving the OpenAI API like one, exporting
per-expert token counts, and exiting non-zero (so Kubernetes restarts the group) when a
rank dies; without a planner, rank 0 starts its followers itself and stops them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from frota.server import ranks
from tests.engine.parallel.conftest import free_port, rank_env

LAUNCH = "import sys; from frota.cli.main import main; sys.exit(main())"
PROMPT = "The group answers"


def start_group(model: str, world: int, extra: list[str]) -> tuple[list[subprocess.Popen], list[int]]:
    """Ranks as the planner starts them: same args, FROTA_RANK each, a port each."""
    master = free_port()
    ports = [free_port() for _ in range(world)]
    procs = []
    for rank in range(world):
        argv = [sys.executable, "-c", LAUNCH, "worker", "--model", model, "--dtype", "float32",
                "--port", str(ports[rank]), "--host", "127.0.0.1", "--num-kv-blocks", "128",
                "--tensor-parallel-size", str(world), *extra]
        procs.append(subprocess.Popen(argv, env=rank_env(rank, world, master),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    return procs, ports


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def wait_ready(procs: list[subprocess.Popen], ports: list[int], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(get(p, "/ready")[0] == 200 for p in ports):
            return
        assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
        time.sleep(0.5)
    raise AssertionError("the group did not become ready")


def complete(port: int, model: str, max_tokens: int = 16) -> dict:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=10)


def test_tp2_worker_serves_the_tp1_output_and_exports_expert_token_counts():
    from frota.engine import LLM, SamplingParams

    model = "synthetic:moe-tiny"
    want = LLM(model, dtype="float32", device="cpu", verbose=False, num_kv_blocks=64).generate(
        [PROMPT], SamplingParams(max_tokens=16, temperature=0.0))[0]
    procs, ports = start_group(model, 2, ["--expert-parallel-size", "2"])
    try:
        wait_ready(procs, ports)
        assert get(ports[1], "/health")[0] == 200  # the follower answers its own probes
        out = complete(ports[0], model)
        assert out["choices"][0]["text"] == want.text
        metrics = get(ports[0], "/metrics")[1]
        counts: dict[str, float] = {}
        for line in metrics.splitlines():
            if line.startswith("frota_expert_tokens_total{"):
                layer = line.split('layer="')[1].split('"')[0]
                counts[layer] = counts.get(layer, 0) + float(line.rsplit(" ", 1)[1])
        # Every computed token picks top-2 experts in every layer: the warm-up request
        # ("Hello": 5 prompt tokens + 1 decode) and this one (prompt + 15 decodes).
        usage = out["usage"]
        tokens = 6 + usage["prompt_tokens"] + usage["completion_tokens"] - 1
        assert counts == {"0": 2 * tokens, "1": 2 * tokens}
    finally:
        stop(procs)


@pytest.mark.parametrize("victim", [1, 0], ids=["follower-dies", "rank0-dies"])
def test_killing_one_rank_makes_the_group_exit_non_zero_within_60s(victim):
    procs, ports = start_group("synthetic:dense-tiny", 2, [])
    try:
        wait_ready(procs, ports)
        procs[victim].kill()
        survivor = procs[1 - victim]
        t0 = time.monotonic()
        code = survivor.wait(timeout=60)
        assert code != 0
        assert time.monotonic() - t0 < 60
    finally:
        stop(procs)


def test_a_local_follower_runs_this_ranks_own_command_on_its_own_port(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/venv/bin/python")
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "dev", "-m", "frota.cli.main",
                                           "worker", "--model", "m", "--port", "8000"])
    assert ranks.follower_argv(8001) == ["/venv/bin/python", "-X", "dev", "-m", "frota.cli.main",
                                          "worker", "--model", "m", "--port", "8000",
                                          "--port", "8001"]


class _Runner:
    def __init__(self) -> None:
        self.num_stops = 0

    def stop_followers(self) -> None:
        self.num_stops += 1


def _rank_zero(exit_code: int = 0, alive: bool = True, loaded: bool = True):
    """The part of rank 0's server the group sees (ranks.RankZero), without a server."""
    runner = _Runner()
    lifecycle = SimpleNamespace(stopped=asyncio.Event(), exit_code=exit_code)
    lifecycle.fail = lambda: (setattr(lifecycle, "exit_code", 1), lifecycle.stopped.set())
    engine = SimpleNamespace(engine=SimpleNamespace(runner=runner))
    state = SimpleNamespace(lifecycle=lifecycle,
                            bindings=SimpleNamespace(engine=engine) if loaded else None,
                            engine_alive=lambda: alive)
    return state, runner


def test_the_watchdog_fails_rank0_once_its_engine_loop_died(monkeypatch):
    monkeypatch.setattr(ranks, "WATCH_INTERVAL_S", 0.01)
    state, _ = _rank_zero(alive=False)
    asyncio.run(asyncio.wait_for(ranks.watch_group(state), 5))
    assert state.lifecycle.exit_code == 1 and state.lifecycle.stopped.is_set()


@pytest.mark.parametrize(("exit_code", "loaded", "num_stops"),
                         [(0, True, 1), (1, True, 0), (0, False, 0)],
                         ids=["drained", "failed", "never-loaded"])
def test_followers_are_told_to_stop_only_after_a_graceful_drain(exit_code, loaded, num_stops):
    state, runner = _rank_zero(exit_code=exit_code, loaded=loaded)
    ranks.stop_followers(state)
    assert runner.num_stops == num_stops


def _two_free_ports() -> int:
    """A port whose successor is free too (a local follower listens on --port + 1)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


def test_without_a_planner_rank0_spawns_its_follower_and_a_drain_stops_it(tmp_path: Path):
    model, port = "synthetic:dense-tiny", _two_free_ports()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FROTA_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", FROTA_COLLECTIVE_TIMEOUT="60")
    log_path = tmp_path / "group.log"
    argv = [sys.executable, "-m", "frota.cli.main", "worker", "--model", model, "--dtype",
            "float32", "--port", str(port), "--host", "127.0.0.1", "--num-kv-blocks", "128",
            "--tensor-parallel-size", "2"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready([proc], [port, port + 1])
            assert complete(port, model)["choices"][0]["text"]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            stop([proc])
    assert get(port + 1, "/health")[0] == 0  # the follower is gone with rank 0
    records = [json.loads(line) for line in log_path.read_text().splitlines()
               if line.startswith("{")]
    said = [r["msg"] for r in records]
    # The follower ran `frota worker` itself: its lines are the worker's JSON logs.
    assert f"follower rank 1: probes on http://127.0.0.1:{port + 1}" in said
    assert "rank 0 said stop" in said
