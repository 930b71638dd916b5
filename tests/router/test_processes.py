"""`frota router --processes N`: several router processes on one port, run as real processes
over loopback, and each process's share of the admission limits."""

import argparse
import asyncio
import os
import signal
import socket
import sys

import aiohttp
import pytest

from frota.router import cli
from frota.router.admission import process_share
from tests.metrics_text import samples
from tests.processes import free_port


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


# -- admission: each process's share ----------------------------------------------------

@pytest.mark.parametrize(("limit", "num_processes", "shares"), [
    (1024, 4, [256, 256, 256, 256]),
    (10, 4, [3, 3, 2, 2]),
    (0, 3, [0, 0, 0]),        # max_inflight 0: unlimited in every process
    (2, 4, [1, 1, 1, 1]),     # never 0, which would lift the limit
    (7, 1, [7]),
])
def test_the_processes_shares_of_a_limit_sum_to_it(limit, num_processes, shares):
    assert [process_share(limit, num_processes, i) for i in range(num_processes)] == shares


def test_each_router_process_admits_its_share_of_the_limits():
    args = parse(["--workers", "a:1", "--processes", "3", "--max-inflight", "100",
                  "--max-queue", "10", "--port", "8000"])
    configs = [cli.config_from_args(args, process=i) for i in range(3)]
    assert [c.max_inflight for c in configs] == [34, 33, 33]
    assert [c.max_queue for c in configs] == [4, 3, 3]
    whole = cli.config_from_args(args)  # the supervisor's own check: the whole limits
    assert (whole.max_inflight, whole.max_queue) == (100, 10)


def test_processes_flag_reads_its_environment_variable(monkeypatch):
    monkeypatch.setenv("FROTA_PROCESSES", "4")
    assert parse([]).processes == 4


# -- real processes ----------------------------------------------------------------------

async def start_processes(worker_urls: list[str], port: int,
                          *flags: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "frota.cli.main", "router", "--workers", ",".join(worker_urls),
        "--host", "127.0.0.1", "--port", str(port), "--processes", "2",
        "--log-level", "warning", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def wait_ready(port: int, proc: asyncio.subprocess.Process) -> None:
    """Until both processes say they listen, and /ready answers 200 (a worker in
    rotation) on 16 fresh connections in a row."""
    listening: set[str] = set()
    async with asyncio.timeout(60):  # two interpreters start on busy cores
        while len(listening) < 2:
            line = (await proc.stdout.readline()).decode()
            assert line, "the supervisor exited before both processes listened"
            if "listening on" in line:
                listening.add(line.rsplit("process ", 1)[-1])
        in_a_row = 0  # each connection lands on either process: 16 in a row is both
        while in_a_row < 16:
            try:
                async with fresh_session() as session, session.get(
                        f"http://127.0.0.1:{port}/ready") as r:
                    in_a_row = in_a_row + 1 if r.status == 200 else 0
            except aiohttp.ClientConnectionError:
                in_a_row = 0
            await asyncio.sleep(0.01)


def routed_by_process(text: str) -> dict[str, float]:
    """Routing decisions in a /metrics page, by the `process` label of their samples."""
    routed: dict[str, float] = {}
    for s in samples(text):
        if s.name == "frota_router_routing_decisions_total":
            process = s.labels["process"]
            routed[process] = routed.get(process, 0.0) + s.value
    return routed


def fresh_session() -> aiohttp.ClientSession:
    """A client whose every request opens a new connection, which the kernel gives to
    either process (SO_REUSEPORT hashes the connection's addresses)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_two_processes_on_one_port_send_each_prefix_to_the_same_worker(start_worker):
    workers = [await start_worker(name=f"w{i}") for i in range(3)]
    port = free_port()
    proc = await start_processes([w.url for w in workers], port, "--policy", "prefix-aware")
    try:
        await wait_ready(port, proc)
        served: dict[int, set[str]] = {}
        async with fresh_session() as session:
            for question in range(6):
                for tenant in range(8):
                    prompt = (f"You are the assistant of tenant {tenant}. " * 8
                              + f"Question {question}?")
                    async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                            json={"prompt": prompt}) as r:
                        assert r.status == 200
                        served.setdefault(tenant, set()).add((await r.json())["worker"])
            # Whichever process a scrape lands on answers for both, each sample labelled
            # with the process that counted it; fresh connections land on both.
            scrapes = []
            for _ in range(8):
                async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    scrapes.append(routed_by_process(await r.text()))
        assert all(len(names) == 1 for names in served.values()), served
        assert len(set().union(*served.values())) > 1  # and the tenants spread
        assert all(scrape == scrapes[0] for scrape in scrapes), scrapes
        by_process = scrapes[0]
        assert set(by_process) == {"0", "1"} and sum(by_process.values()) == 48, by_process
        assert all(routed > 0 for routed in by_process.values()), by_process  # both took some
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await stop(proc)


async def test_two_processes_never_admit_more_than_the_pods_limit(start_worker):
    """--max-inflight 4 over two processes: 2 each. Of 12 streams on fresh connections the
    pod admits at most 4 (the tolerance is one-sided) and at least 4 - 2 (all but one
    process's share, docs/router.md); the rest get 429 with Retry-After at once."""
    worker = await start_worker(name="w", num_tokens=3)
    worker.gate, worker.gate_at_chunk = asyncio.Event(), 1  # admitted streams stay open
    port = free_port()
    proc = await start_processes([worker.url], port, "--max-inflight", "4",
                                 "--max-queue", "0")
    streams: list[asyncio.Task[tuple[int, str | None, bytes]]] = []
    try:
        await wait_ready(port, proc)
        started = asyncio.Queue()
        async with fresh_session() as session:
            async def stream() -> tuple[int, str | None, bytes]:
                async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                        json={"prompt": "x", "stream": True}) as r:
                    started.put_nowait(r.status)
                    return r.status, r.headers.get("Retry-After"), await r.read()

            streams = [asyncio.create_task(stream()) for _ in range(12)]
            statuses = [await asyncio.wait_for(started.get(), 30) for _ in range(12)]
            admitted = statuses.count(200)
            assert 2 <= admitted <= 4 and statuses.count(429) == 12 - admitted, statuses
            assert len(worker.bodies) == admitted  # nothing past the limit reached it
            async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                inflight = {s.labels["process"]: s.value for s in samples(await r.text())
                            if s.name == "frota_router_inflight_requests"}
            assert sum(inflight.values()) == admitted and max(inflight.values()) <= 2, inflight
            worker.gate.set()
            answers = await asyncio.gather(*streams)
        assert all(retry_after for status, retry_after, _ in answers if status == 429)
        assert all(body.rstrip().endswith(b"data: [DONE]")
                   for status, _, body in answers if status == 200)
    finally:
        for task in streams:
            task.cancel()
        await stop(proc)


async def test_sigterm_lets_every_process_finish_its_streams(start_worker):
    worker = await start_worker(name="slow", num_tokens=10, token_delay=0.2)
    port = free_port()
    proc = await start_processes([worker.url], port, "--drain-timeout", "20")
    streams: list[asyncio.Task[bytes]] = []
    try:
        await wait_ready(port, proc)
        async with fresh_session() as session:
            async def stream() -> bytes:
                async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                        json={"prompt": "x", "stream": True}) as r:
                    assert r.status == 200
                    return await r.read()

            streams = [asyncio.create_task(stream()) for _ in range(6)]
            while worker.num_chunks_sent < 6:  # every stream under way
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            bodies = await asyncio.gather(*streams)
        assert all(body.rstrip().endswith(b"data: [DONE]") for body in bodies)
        assert all(body.count(b"data: {") == 10 for body in bodies)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        for task in streams:
            task.cancel()
        await stop(proc)


async def test_a_process_that_cannot_start_stops_the_supervisor(start_worker):
    worker = await start_worker(name="w")
    with socket.socket() as taken:  # the port held without SO_REUSEPORT: no child binds
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await start_processes([worker.url], port)
        try:
            code = await asyncio.wait_for(proc.wait(), 60)
        finally:
            await stop(proc)
    output = (await proc.stdout.read()).decode()
    assert code != 0 and "stopping the others" in output


def test_processes_needs_a_fixed_port():
    out = __import__("subprocess").run(
        [sys.executable, "-m", "frota.cli.main", "router", "--workers", "http://127.0.0.1:9",
         "--port", "0", "--processes", "2"],
        capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.returncode == 2 and "--processes" in out.stderr
