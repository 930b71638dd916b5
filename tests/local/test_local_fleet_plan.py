"""From manifest to local processes: ports, rank environment, devices; and the status table."""

from __future__ import annotations

import socket

import pytest

from frota.api.exposition import sample_totals
from frota.local import fleet, topology
from frota.local.fleet import FleetOptions, build
from frota.local.ports import PortInUseError, free_ports, require_free
from frota.local.state import FleetState
from frota.local.status import Row, render

from .conftest import free_port


def default_topology() -> topology.LocalTopology:
    return topology.plan(topology.load(None))


def test_default_manifest_is_smollm2_one_replica_on_cpu():
    isvc = topology.load(None)
    assert isvc.metadata.name == "smollm2"
    assert isvc.spec.model.uri == "alias:smollm2"
    assert isvc.spec.replicas == 1 and isvc.spec.resources.accelerator is None


def test_workers_take_the_ports_after_the_router_skipping_taken_ones():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        opts = FleetOptions(port=free_port(), worker_base_port=busy)
        local = build(default_topology(), opts)
    worker = local.worker_groups[0].processes[0]
    assert worker.port is not None and worker.port > busy
    assert worker.argv[-4:] == ("--host", "127.0.0.1", "--port", str(worker.port))
    assert worker.argv.count("--port") == 1  # the planner's port is replaced, not duplicated
    assert worker.ready_url == f"http://127.0.0.1:{worker.port}/ready"
    assert local.router.processes[0].argv[-2:] == ("--port", str(opts.port))


def test_rank_env_points_at_loopback_and_a_cpu_fleet_sees_no_gpu():
    local = build(default_topology(), FleetOptions(port=free_port()))
    env = local.worker_groups[0].processes[0].env
    assert env["FROTA_MASTER_ADDR"] == "127.0.0.1"
    assert env["FROTA_RANK"] == "0" and env["FROTA_WORLD_SIZE"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["FROTA_SERVED_MODEL_NAME"] == "smollm2"  # the planner's engine env is kept


def test_router_gets_every_group_leader_and_the_manifest_policy():
    isvc = topology.load(None)
    spec = isvc.spec.model_copy(update={"replicas": 3})
    topo = topology.plan(isvc.model_copy(update={"spec": spec}))
    local = build(topo, FleetOptions(port=free_port()))
    argv = local.router.processes[0].argv
    urls = argv[argv.index("--workers") + 1].split(",")
    assert urls == [f"http://127.0.0.1:{g.processes[0].port}" for g in local.worker_groups]
    assert argv[argv.index("--policy") + 1] == "least-load"


def test_gpu_ranks_each_get_their_own_devices(monkeypatch: pytest.MonkeyPatch, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(fleet, "count_local_accelerators", lambda _: 4)
    manifest = tmp_path / "gpu.yaml"
    manifest.write_text(topology.default_manifest_text().replace(
        "  replicas: 1\n", "  replicas: 2\n").replace(
        "    memory: 2Gi\n", "    memory: 2Gi\n    accelerator: {count: 2, memory: 16Gi}\n"))
    local = build(topology.plan(topology.load(str(manifest))), FleetOptions(port=free_port()))
    assert [g.processes[0].env["CUDA_VISIBLE_DEVICES"] for g in local.worker_groups] == ["0,1",
                                                                                         "2,3"]


def test_every_argument_and_variable_of_a_process_is_the_plans(monkeypatch: pytest.MonkeyPatch):
    """frota up plans on the ports it took (a LocalAddressing) and runs that plan as it is."""
    from frota.plan import planner

    topo, given = default_topology(), []
    real_plan = planner.plan

    def spy(isvc, addressing=None, **kwargs):  # type: ignore[no-untyped-def]
        given.append(addressing)
        return real_plan(isvc, addressing, **kwargs)

    monkeypatch.setattr(planner, "plan", spy)
    local = build(topo, FleetOptions(port=free_port(), fleet_key_file="/k"))
    [addressing] = given
    planned = real_plan(topo.isvc, addressing, converted_dir=str(topology.converted_models_dir()))
    [group], [worker] = planned.groups, local.worker_groups
    [rank], [proc] = group.ranks, worker.processes
    assert addressing.http_ports == ((proc.port,),) and rank.http_port == proc.port
    assert proc.argv[-len(rank.args):] == rank.args
    assert proc.env == planned.rank_env(group, rank)
    assert local.router.processes[0].env == dict(planned.router.env)


def test_free_ports_skips_a_listening_port_and_require_free_names_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert busy not in free_ports(2, busy)
        with pytest.raises(PortInUseError, match=f"port {busy} on 127.0.0.1 is in use"):
            require_free(busy, "127.0.0.1", "router")


def test_parse_metrics_sums_label_sets():
    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{model_name="a"} 2\n'
            'vllm:num_requests_running{model_name="b"} 3\n'
            '# TYPE vllm:generation_tokens counter\n'
            'vllm:generation_tokens_total{model_name="a"} 10\n')
    metrics = sample_totals(text)
    assert metrics["vllm:num_requests_running"] == 5
    assert metrics["vllm:generation_tokens_total"] == 10


def test_status_table_counts_ready_replicas():
    state = FleetState(name="s", model="m", url="http://127.0.0.1:8000", port=8000)
    rows = [Row("worker-0", "worker", 10, 8001, True, 0, 1, 0, 0.5, 12.0),
            Row("worker-1", "worker", 11, 8002, False, 2),
            Row("router", "router", 12, 8000, True, 0)]
    text = render(state, rows)
    assert "replicas ready 1/2" in text.splitlines()[0]
    assert text.splitlines()[2].split() == ["worker-0", "worker", "yes", "10", "8001", "1", "0",
                                           "50.0", "12.0", "0"]


def test_frota_up_and_status_never_import_torch():
    import subprocess
    import sys

    code = ("import sys, frota.local.up, frota.local.status; "
            "frota.local.up.plan(frota.local.up.load(None)); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("sample", [None, "cpu-tiny-smollm2.yaml", "disaggregated.yaml"])
def test_real_worker_and_router_accept_the_planned_flags_and_env(sample: str | None):
    """Every argv and env frota up would start parses in the real `frota worker`/`router`."""
    import os
    import subprocess
    from pathlib import Path

    path = None if sample is None else str(Path(__file__).parents[2] / "manifests/samples" / sample)
    local = build(topology.plan(topology.load(path)), FleetOptions(port=free_port()))
    checked = {}
    for group in local.groups:
        proc = group.processes[0]
        command = proc.argv[3]  # (python, -m, frota.cli.main, worker|router, ...)
        if command in checked:
            continue
        out = subprocess.run([*proc.argv, "--help"], env={**os.environ, **proc.env},
                             capture_output=True, text=True)
        assert out.returncode == 0, f"{command}: {out.stderr}"
        checked[command] = True


def test_tokens_per_second_sees_requests_still_running():
    from frota.local.status import tokens_per_second

    before = {"vllm:time_to_first_token_seconds_count": 1, "vllm:inter_token_latency_seconds_count": 9}
    after = {"vllm:time_to_first_token_seconds_count": 1, "vllm:inter_token_latency_seconds_count": 29}
    assert tokens_per_second(before, after, 2.0) == 10.0
    assert tokens_per_second({}, {"vllm:generation_tokens_total": 40}, 2.0) == 20.0
    assert tokens_per_second({}, {}, 1.0) is None


def test_every_process_of_a_local_fleet_gets_the_runs_fleet_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from frota.api.contract import FleetKey

    sample = Path(__file__).resolve().parents[2] / "manifests/samples/disaggregated.yaml"
    key = tmp_path / "fleet-key"
    local = build(topology.plan(topology.load(str(sample))),
                  FleetOptions(port=free_port(), fleet_key_file=str(key)))
    assert {p.env[FleetKey.FILE_ENV] for g in local.groups for p in g.processes} == {str(key)}
    assert len([p for g in local.groups for p in g.processes]) >= 3  # prefill, decode, router


def test_each_run_writes_a_new_private_key(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import stat

    from frota.local import state

    monkeypatch.setenv("FROTA_STATE_DIR", str(tmp_path))
    first = state.write_fleet_key(8123).read_text()
    path = state.write_fleet_key(8123)
    assert path == state.fleet_key_path(8123) and path.read_text() != first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
