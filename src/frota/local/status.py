"""`frota status`: the local fleets `frota up` runs, read from their state files and /metrics.

Per process: readiness, running and waiting requests, KV cache usage, and
generated tokens per second (two scrapes `--interval` seconds apart).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass

import aiohttp

from frota.api.contract import RouterMetric, ServingPath, WorkerMetric
from frota.api.exposition import sample_totals
from frota.local import state


@dataclass
class Row:
    """One process of a fleet, with what its endpoints said."""

    name: str
    role: str
    pid: int | None
    port: int | None
    is_ready: bool | None
    num_restarts: int
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1
    tokens_per_s: float | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=None,
                        help="only the fleet whose router listens on this port")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between the two scrapes that measure tokens/s (default: 1)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    """Print every running local fleet (or the one on --port)."""
    fleets = [f for f in state.read_all() if args.port is None or f.port == args.port]
    if not fleets:
        where = f" on port {args.port}" if args.port else ""
        print(f"frota status: no local fleet is running{where} (start one with `frota up`)",
              file=sys.stderr)
        return 1
    results = asyncio.run(_collect(fleets, args.interval))
    if args.json:
        print(json.dumps([{"name": f.name, "model": f.model, "url": f.url, "pid": f.pid,
                           "processes": [asdict(r) for r in rows]} for f, rows in results],
                         indent=2))
    else:
        for fleet, rows in results:
            print(render(fleet, rows))
    return 0


async def _collect(fleets: list[state.FleetState],
                   interval: float) -> list[tuple[state.FleetState, list[Row]]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
        procs = [p for f in fleets for p in f.processes]
        first = await asyncio.gather(*(_scrape(session, p) for p in procs))
        t0 = time.monotonic()
        await asyncio.sleep(interval)
        second = await asyncio.gather(*(_scrape(session, p) for p in procs))
        dt = time.monotonic() - t0
    by_proc = dict(zip((id(p) for p in procs), zip(first, second, strict=True), strict=True))
    out = []
    for fleet in fleets:
        rows = []
        for p in fleet.processes:
            (_, m0), (ready1, m1) = by_proc[id(p)]
            row = Row(p.name, p.role, p.pid, p.port,
                      is_ready=ready1 if p.url else None, num_restarts=p.num_restarts)
            if m1:
                row.running = m1.get(WorkerMetric.NUM_REQUESTS_RUNNING,
                                     m1.get(RouterMetric.INFLIGHT_REQUESTS))
                row.waiting = m1.get(WorkerMetric.NUM_REQUESTS_WAITING,
                                     m1.get(RouterMetric.QUEUE_DEPTH))
                row.kv_usage = m1.get(WorkerMetric.KV_CACHE_USAGE_PERC)
                # A worker that has made no token yet exports no token series.
                rate = tokens_per_second(m0, m1, dt)
                row.tokens_per_s = 0.0 if rate is None and p.role != "router" else rate
            rows.append(row)
        out.append((fleet, rows))
    return out


async def _scrape(session: aiohttp.ClientSession,
                  proc: state.ProcessState) -> tuple[bool, dict[str, float]]:
    """(is ready, metric samples summed over labels) of a process with an HTTP address."""
    if not proc.url:
        return False, {}
    try:
        async with session.get(f"{proc.url}{proc.ready_path}") as resp:
            is_ready = resp.status == 200
        async with session.get(f"{proc.url}{ServingPath.METRICS}") as resp:
            text = await resp.text() if resp.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False, {}
    return is_ready, sample_totals(text)


def tokens_per_second(before: dict[str, float], after: dict[str, float],
                      seconds: float) -> float | None:
    """Generated tokens per second between two scrapes.

    `vllm:generation_tokens_total` grows when a request finishes; the time to
    first token and inter-token latency histograms count one observation per
    token as it is made, so they show the rate of long requests still running.
    The larger of the two is the better estimate.
    """
    def delta(*names: str) -> float | None:
        if not all(n in after for n in names):
            return None
        return sum(after[n] - before.get(n, 0.0) for n in names)

    rates = [d / seconds for d in (
        delta(WorkerMetric.GENERATION_TOKENS + "_total"),
        delta(WorkerMetric.TIME_TO_FIRST_TOKEN_SECONDS + "_count",
              WorkerMetric.INTER_TOKEN_LATENCY_SECONDS + "_count"),
    ) if d is not None]
    return max(0.0, *rates) if rates else None


def render(fleet: state.FleetState, rows: list[Row]) -> str:
    """A fleet as a header line and a table."""
    uptime = int(time.time() - fleet.started_at)
    ready = sum(1 for r in rows if r.role != "router" and r.is_ready)
    leaders = sum(1 for r in rows if r.role != "router" and r.is_ready is not None)
    lines = [f"{fleet.name}: {fleet.url}/v1  model {fleet.model}  "
             f"replicas ready {ready}/{leaders}  up {uptime // 60}m{uptime % 60:02d}s  "
             f"(frota up pid {fleet.pid})"]
    header = ("NAME", "ROLE", "READY", "PID", "PORT", "RUNNING", "WAITING", "KV%", "TOK/S",
              "RESTARTS")
    table = [header]
    for r in rows:
        table.append((
            r.name, r.role,
            "-" if r.is_ready is None else "yes" if r.is_ready else "no",
            str(r.pid or "-"), str(r.port or "-"),
            _num(r.running), _num(r.waiting),
            "-" if r.kv_usage is None else f"{100 * r.kv_usage:.1f}",
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.1f}",
            str(r.num_restarts),
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in table]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
