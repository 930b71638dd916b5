"""The supervisor runs real child processes: readiness, restarts with backoff, clean stops."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from frota.local.ports import is_port_free
from frota.local.supervisor import GroupSpec, ProcessSpec, StartupError, Supervisor, Timing

from .conftest import child_argv, free_port, wait_until


def http_child(name: str, port: int, *extra: str, rank: int = 0) -> ProcessSpec:
    return ProcessSpec(name=name, argv=child_argv(port, *extra), port=port,
                       ready_url=f"http://127.0.0.1:{port}/ready", rank=rank)


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_group_becomes_ready_and_stop_frees_its_ports():
    ports = [free_port(), free_port()]
    groups = [GroupSpec("g0", (http_child("a", ports[0], "--ready-after", "0.3"),)),
              GroupSpec("g1", (http_child("b", ports[1]),))]
    sup = Supervisor(groups)
    await sup.start(timeout=20)
    assert all(m.is_ready and m.is_running for m in sup.processes)
    pids = [m.pid for m in sup.processes]
    await sup.stop()
    assert all(is_gone(pid) for pid in pids)
    assert all(is_port_free(p) for p in ports)


async def test_process_that_exits_before_ready_fails_startup_with_its_last_lines():
    port = free_port()
    spec = http_child("w", port, "--ready-after", "60", "--exit-after", "0.2")
    sup = Supervisor([GroupSpec("g", (spec,))])
    with pytest.raises(StartupError, match="w exited with code 3") as err:
        await sup.start(timeout=20)
    assert any("exiting on purpose" in line for line in err.value.log_tail)
    await sup.stop()


async def test_fleet_not_ready_in_time_fails_startup_naming_the_slow_process():
    port = free_port()
    sup = Supervisor([GroupSpec("g", (http_child("slow", port, "--ready-after", "60"),))])
    with pytest.raises(StartupError, match="slow was not ready after"):
        await sup.start(timeout=1)
    pid = sup.processes[0].pid
    await sup.stop()
    assert pid is not None and is_gone(pid)


async def test_killed_rank_restarts_its_whole_group_and_it_becomes_ready_again():
    port = free_port()
    leader = http_child("r0", port)
    follower = ProcessSpec(name="r1", argv=(sys.executable, "-c", "import time; time.sleep(600)"),
                           rank=1)
    events: list[tuple[str, str]] = []
    sup = Supervisor([GroupSpec("g", (leader, follower))], timing=Timing(backoff_initial=0.1),
                     on_event=lambda kind, m, _: events.append((kind, m.spec.name)))
    await sup.start(timeout=20)
    task = asyncio.create_task(sup.supervise())
    old = {m.spec.name: m.pid for m in sup.processes}
    os.kill(old["r1"], signal.SIGKILL)
    for _ in range(200):
        if all(m.num_restarts == 1 and m.is_ready for m in sup.processes):
            break
        await asyncio.sleep(0.05)
    assert all(m.num_restarts == 1 and m.is_ready for m in sup.processes), events
    assert all(m.pid != old[m.spec.name] for m in sup.processes)
    assert is_gone(old["r0"]), "the leader is restarted with its follower"
    assert ("exited", "r1") in events
    task.cancel()
    await sup.stop()


async def test_restart_delay_doubles_while_a_process_keeps_failing():
    port = free_port()
    spec = http_child("flaky", port, "--exit-after", "0.3")
    delays: list[str] = []
    sup = Supervisor([GroupSpec("g", (spec,))], timing=Timing(backoff_initial=0.1),
                     on_event=lambda kind, _m, msg: kind == "exited" and delays.append(msg))
    await sup.start(timeout=20)
    task = asyncio.create_task(sup.supervise())
    for _ in range(200):
        if len(delays) >= 3:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    await sup.stop()
    assert [d.split(" in ")[-1] for d in delays[:3]] == ["0.1 s", "0.2 s", "0.4 s"]


async def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace_period():
    port = free_port()
    sup = Supervisor([GroupSpec("g", (http_child("stubborn", port, "--ignore-term"),))],
                     timing=Timing(grace_period=0.5))
    await sup.start(timeout=20)
    pid = sup.processes[0].pid
    await sup.stop()
    assert pid is not None and is_gone(pid)
    assert is_port_free(port)


async def test_stop_also_ends_what_a_child_started(tmp_path: Path):
    port = free_port()
    pidfile = tmp_path / "grandchild.pid"
    sup = Supervisor([GroupSpec("g", (http_child("parent", port, "--grandchild", str(pidfile)),))])
    await sup.start(timeout=20)
    grandchild = int(pidfile.read_text())
    assert not is_gone(grandchild)
    await sup.stop()
    wait_until(lambda: is_gone(grandchild), 5, "the grandchild to end")


def test_children_die_when_the_supervisor_is_sigkilled(tmp_path: Path):
    port = free_port()
    pidfile = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(Path(__file__).parent.parent.parent)!r})
        from frota.local.supervisor import GroupSpec, ProcessSpec, Supervisor
        from tests.local.conftest import child_argv

        async def main():
            spec = ProcessSpec("c", child_argv({port}), ready_url="http://127.0.0.1:{port}/ready")
            sup = Supervisor([GroupSpec("g", (spec,))])
            await sup.start(timeout=20)
            open({str(pidfile)!r}, "w").write(str(sup.processes[0].pid))
            await asyncio.sleep(600)

        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text(), 20, "the child to be ready")
        child = int(pidfile.read_text())
        parent.kill()
        parent.wait()
        wait_until(lambda: is_gone(child), 5, "the orphaned child to die")
        wait_until(lambda: is_port_free(port), 5, "the child's port to be freed")
    finally:
        parent.kill()


async def test_process_failing_its_liveness_probe_is_killed_and_restarted():
    port = free_port()
    spec = ProcessSpec(name="hung", argv=child_argv(port, "--unhealthy-after", "0.5"), port=port,
                       ready_url=f"http://127.0.0.1:{port}/ready",
                       live_url=f"http://127.0.0.1:{port}/health")
    events: list[str] = []
    sup = Supervisor([GroupSpec("g", (spec,))],
                     timing=Timing(backoff_initial=0.1, liveness_period=0.2),
                     on_event=lambda kind, _m, _d: events.append(kind))
    await sup.start(timeout=20)
    first = sup.processes[0].pid
    task = asyncio.create_task(sup.supervise())
    for _ in range(200):
        if sup.processes[0].num_restarts >= 1 and sup.processes[0].is_ready:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    await sup.stop()
    assert "unhealthy" in events and sup.processes[0].pid != first
    assert first is not None and is_gone(first)
