"""`frota up` as a command: bad input gets one clear line, and a (fake) fleet starts and stops cleanly.

The fleet here is tests/local/fake_fleet.py behind `--launcher`, so these
tests pin frota up's own behaviour (signals, state file, status, restarts)
in seconds; test_local_up_fleet.py runs the real worker and router.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from frota.local.fleet import count_local_accelerators
from frota.local.ports import is_port_free

from .conftest import free_port, wait_until
from .fleet_process import BANNER, FAKE_LAUNCHER, UpProcess, all_gone


def frota(*args: str, state_dir: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    if state_dir is not None:
        full_env["FROTA_STATE_DIR"] = str(state_dir)
    return subprocess.run([sys.executable, "-m", "frota.cli.main", *args], capture_output=True,
                          text=True, env=full_env, timeout=120)


def manifest(tmp_path: Path, spec: str, name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_text(
        "apiVersion: frota.dev/v1alpha1\nkind: InferenceService\nmetadata:\n  name: demo\n"
        "spec:\n" + "".join(f"  {line}\n" for line in spec.strip().splitlines())
    )
    return str(path)


SMOL = "model: {name: smollm2, uri: 'alias:smollm2'}"


@contextlib.contextmanager
def serving_fleet(tmp_path: Path, *argv: str) -> Iterator[tuple[UpProcess, int]]:
    """`frota up ARGV` with the fake launcher on a free port, once it is serving: the
    process and its port. Whatever is left of it is killed on the way out."""
    port = free_port()
    up = UpProcess(*argv, "--port", str(port), "--launcher", FAKE_LAUNCHER, state_dir=tmp_path)
    try:
        up.wait_for(BANNER, 60)
        yield up, port
    finally:
        up.kill_everything()


def say_hi(port: int) -> str:
    """The fleet's answer to one chat message, through the official client."""
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(model="smollm2", max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content


def test_dry_run_of_the_default_lists_one_worker_and_the_router():
    out = frota("up", "--dry-run", "--port", str(free_port()))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("worker-0:") and "worker --model smollm2" in line for line in lines)
    assert any(line.startswith("router:") and "--workers http://127.0.0.1:" in line for line in lines)


def test_tensor_parallel_manifest_plans_two_ranks_joined_on_loopback(tmp_path: Path):
    path = manifest(tmp_path, f"{SMOL}\nparallelism: {{tensor: 3}}")
    out = frota("up", path, "--dry-run", "--port", str(free_port()))
    assert out.returncode == 0, out.stderr
    ranks = [line for line in out.stdout.splitlines() if line.startswith("worker-0.")]
    assert len(ranks) == 3
    assert all("FROTA_MASTER_ADDR=127.0.0.1" in r and "FROTA_WORLD_SIZE=3" in r for r in ranks)
    assert len({r.split("FROTA_MASTER_PORT=")[1].split()[0] for r in ranks}) == 1


def test_disaggregated_manifest_plans_prefill_and_decode_groups(tmp_path: Path):
    path = manifest(tmp_path, f"{SMOL}\ndisaggregation: {{prefill: {{replicas: 1}}, "
                              "decode: {replicas: 2}}")
    out = frota("up", path, "--dry-run", "--port", str(free_port()))
    assert out.returncode == 0, out.stderr
    names = [line.split(":")[0] for line in out.stdout.splitlines() if not line.startswith("#")]
    assert names == ["prefill-0", "decode-0", "decode-1", "router"]
    assert "--role prefill" in out.stdout and "--role decode" in out.stdout


def test_invalid_manifest_gets_the_field_level_message_and_exit_2(tmp_path: Path):
    path = manifest(tmp_path, f"{SMOL}\nreplicas: -1")
    out = frota("up", path)
    assert out.returncode == 2
    assert 'InferenceService "demo" is invalid' in out.stderr
    assert "spec.replicas: Input should be greater than or equal to 0" in out.stderr


def test_semantic_error_names_the_field(tmp_path: Path):
    path = manifest(tmp_path, f"{SMOL}\nparallelism: {{tensor: 2}}")
    out = frota("up", path)
    assert out.returncode == 2
    assert "spec.parallelism.tensor: 2 does not divide the 9 attention heads" in out.stderr


def test_missing_file_is_one_line(tmp_path: Path):
    out = frota("up", str(tmp_path / "nope.yaml"))
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0
    assert "cannot read" in out.stderr


def test_port_in_use_is_one_line_and_starts_nothing(tmp_path: Path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        out = frota("up", "--port", str(port), "--launcher", FAKE_LAUNCHER, state_dir=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"frota up: port {port} on 127.0.0.1 is in use (router); stop what holds it "
        "(another `frota up`? see `frota status`) or pick another with --port"
    )
    assert not list(tmp_path.iterdir())


def test_remote_model_source_is_unsupported_locally_in_one_line(tmp_path: Path):
    path = manifest(tmp_path, "model: {name: x, uri: 'hf://org/repo'}")
    out = frota("up", path, "--port", str(free_port()))
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0
    assert "hf:// models need a cluster" in out.stderr


@pytest.mark.skipif(count_local_accelerators("nvidia.com/gpu") > 0, reason="this machine has a GPU")
def test_gpu_request_on_a_cpu_only_machine_is_one_line(tmp_path: Path):
    path = manifest(tmp_path, f"{SMOL}\nresources: {{accelerator: {{count: 1, memory: 80Gi}}}}")
    out = frota("up", path, "--port", str(free_port()))
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0
    assert "asks for 1 nvidia.com/gpu" in out.stderr and "this machine has 0" in out.stderr


def test_worker_that_cannot_start_fails_the_fleet_and_leaves_nothing_running(tmp_path: Path):
    port = free_port()
    up = UpProcess("--port", str(port), "--launcher", FAKE_LAUNCHER, state_dir=tmp_path,
                   env={"FAKE_WORKER_FAIL": "1"})
    try:
        assert up.proc.wait(60) == 1
        up.wait_for("frota up: worker-0 exited with code 7 before it was ready", 5)
        assert "fake: cannot load the model" in up.output
        assert is_port_free(port)
        assert not list(tmp_path.glob("up-*.json"))
    finally:
        up.kill_everything()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_signal_stops_every_process_frees_the_ports_and_removes_the_state(
        tmp_path: Path, sig: signal.Signals):
    with serving_fleet(tmp_path) as (up, port):
        children = up.children()
        assert len(children) == 2
        state = json.loads((tmp_path / f"up-{port}.json").read_text())
        ports = [p["port"] for p in state["processes"]]
        assert say_hi(port).startswith("hello from")
        assert up.stop(sig) == 0
        assert all_gone(children)
        assert all(is_port_free(p) for p in ports)
        assert not (tmp_path / f"up-{port}.json").exists()


def test_status_shows_readiness_and_metrics_of_the_running_fleet(tmp_path: Path):
    with serving_fleet(tmp_path) as (up, _):
        table = frota("status", "--interval", "0.2", state_dir=tmp_path)
        assert table.returncode == 0, table.stderr
        assert "replicas ready 1/1" in table.stdout
        worker = next(line for line in table.stdout.splitlines() if line.startswith("worker-0"))
        assert worker.split()[2] == "yes" and "25.0" in worker.split()
        data = json.loads(frota("status", "--json", "--interval", "0.1",
                                state_dir=tmp_path).stdout)
        assert data[0]["processes"][0]["kv_usage"] == 0.25
        up.stop()
    gone = frota("status", state_dir=tmp_path)
    assert gone.returncode == 1 and "no local fleet is running" in gone.stderr


def test_killed_worker_is_restarted_and_traffic_recovers(tmp_path: Path):
    with serving_fleet(tmp_path) as (up, port):
        state_file = tmp_path / f"up-{port}.json"
        worker = json.loads(state_file.read_text())["processes"][0]
        os.kill(worker["pid"], signal.SIGKILL)
        up.wait_for("worker-0 exited (code -9; restarting group in 1 s)", 20)
        up.wait_for("worker-0 ready in", 30)

        def restarted() -> dict | None:
            new = json.loads(state_file.read_text())["processes"][0]
            return new if new["num_restarts"] == 1 and new["is_ready"] else None

        new = wait_until(restarted, 10, "the state file to show the restart")
        assert isinstance(new, dict) and new["pid"] != worker["pid"]
        assert not psutil.pid_exists(worker["pid"]) or \
            psutil.Process(worker["pid"]).status() == psutil.STATUS_ZOMBIE
        assert say_hi(port) == f"hello from {new['pid']}"
        up.stop()


def test_sigkill_of_frota_up_leaves_no_orphans(tmp_path: Path):
    with serving_fleet(tmp_path) as (up, port):
        children = up.children()
        up.stop(signal.SIGKILL)
        wait_until(lambda: all_gone(children), 10, "the children to die with their parent")
        wait_until(lambda: is_port_free(port), 10, "the router port to be freed")


def test_killing_one_rank_of_a_sharded_replica_restarts_the_whole_group(tmp_path: Path):
    path = manifest(tmp_path, "model: {name: tiny, uri: 'synthetic:dense-tiny'}\n"
                              "parallelism: {tensor: 2}")
    with serving_fleet(tmp_path, path) as (up, port):
        assert "worker-0.1 running (rank 1" in up.output
        state_file = tmp_path / f"up-{port}.json"
        procs = {p["name"]: p for p in json.loads(state_file.read_text())["processes"]}
        assert procs["worker-0.0"]["rank"] == 0 and procs["worker-0.1"]["url"] is None
        os.kill(procs["worker-0.1"]["pid"], signal.SIGKILL)
        up.wait_for("worker-0.1 exited (code -9; restarting group in 1 s)", 20)

        def both_restarted() -> bool:
            now = {p["name"]: p for p in json.loads(state_file.read_text())["processes"]}
            return all(now[n]["num_restarts"] == 1 and now[n]["pid"] != procs[n]["pid"]
                       for n in procs if n.startswith("worker"))

        wait_until(both_restarted, 30, "rank 0 and rank 1 to be restarted together")
        up.stop()
