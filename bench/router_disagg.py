"""`python bench/router.py --disagg`: colocated vs disaggregated prefill/decode, same hardware.

Two worker processes either way, each with one intra-op thread:
- colocated: two `--role both` workers behind `frota router` (least-load);
- disaggregated: one `--role prefill` and one `--role decode` worker behind `frota router
  --prefill-workers ... --decode-workers ... --disagg-min-prompt-tokens N`: long prompts
  prefill on one process and decode on the other, short ones run whole on the decode worker.

The workload mixes long prompts (`--long-chars`) and short ones, all streaming, with
`--concurrency` in flight. For each setup: TTFT p50/p99 and ITL p50/p99 (gaps between
stream chunks, as the client sees them) overall and per prompt kind. Transfer rate comes
from the decode worker's `frota_kv_transfer_bytes_total` / `frota_kv_transfer_seconds_sum`
(receive: request to last byte copied, including the wait for the engine thread to
allocate blocks) and the prefill worker's send side.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp

# The process harness and the /metrics reader live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.metrics_text import metric_sum
from tests.processes import ServingProcess, free_port, frota_argv

WORDS = ["cluster", "node", "pod", "router", "prefill", "decode", "cache", "block", "token", "stream", "latency", "throughput", "replica", "worker", "tensor", "layer", "batch", "queue", "scheduler", "memory"]


def _prompt(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    bodies = []
    for i in range(args.requests):
        is_long = i % args.long_every == 0
        bodies.append({"model": args.model_name, "stream": True, "temperature": 0,
                       "ignore_eos": True, "max_tokens": args.max_tokens,
                       "prompt": f"{i}: " + _prompt(rng, args.long_chars if is_long
                                                    else args.short_chars),
                       "_kind": "long" if is_long else "short"})
    return bodies


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    payload = {k: v for k, v in body.items() if not k.startswith("_")}
    started = time.perf_counter()
    stamps: list[float] = []
    ok = False
    async with session.post(url + "/v1/completions", json=payload) as resp:
        if resp.status == 200:
            buf = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                buf += chunk
                events = buf.split(b"\n\n")
                buf = events.pop()
                for event in events:
                    if event.startswith(b"data: {"):
                        stamps.append(now)
                    elif event.startswith(b"data: [DONE]"):
                        ok = True
        else:
            await resp.read()
    ttft = stamps[0] - started if stamps else float("nan")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {"kind": body["_kind"], "ok": ok, "ttft": ttft, "gaps": gaps}


async def _load(url: str, bodies: list[dict[str, Any]], concurrency: int) -> list[dict[str, Any]]:
    semaphore = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as session:
        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with semaphore:
                return await _one(session, url, body)
        return await asyncio.gather(*(one(b) for b in bodies))


def _summary(results: list[dict[str, Any]], bench: ModuleType, wall: float) -> dict[str, Any]:
    def stats(rs: list[dict[str, Any]]) -> dict[str, Any]:
        ttfts = [r["ttft"] for r in rs]
        gaps = [g for r in rs for g in r["gaps"]]
        return {"requests": len(rs), "ok": sum(r["ok"] for r in rs),
                "ttft_p50_ms": bench.ms(bench.pct(ttfts, 50)),
                "ttft_p99_ms": bench.ms(bench.pct(ttfts, 99)),
                "itl_p50_ms": bench.ms(bench.pct(gaps, 50)),
                "itl_p99_ms": bench.ms(bench.pct(gaps, 99))}

    out = stats(results)
    out["wall_s"] = round(wall, 2)
    for kind in ("long", "short"):
        out[kind] = stats([r for r in results if r["kind"] == kind])
    return out


async def _metrics_page(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        return await r.text()


def _worker(args: argparse.Namespace, name: str, role: str, log_dir: Path) -> ServingProcess:
    port = free_port()
    argv = frota_argv("worker", "--model", args.disagg_model, "--role", role,
                      "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "2048",
                      "--served-model-name", args.model_name, port=port)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return ServingProcess(name, argv, port, log_dir / f"{name}.log")


def _router(log_dir: Path, name: str, flags: list[str]) -> ServingProcess:
    port = free_port()
    argv = frota_argv("router", "--policy", "least-load", "--max-inflight", "0",
                      "--log-level", "warning", *flags, port=port)
    return ServingProcess(name, argv, port, log_dir / f"{name}.log")


async def _run_setup(bench: ModuleType, args: argparse.Namespace, log_dir: Path,
                     disaggregated: bool, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    roles = ("prefill", "decode") if disaggregated else ("both", "both")
    tag = "disagg" if disaggregated else "coloc"
    workers = [_worker(args, f"{tag}-{i}-{role}", role, log_dir)
               for i, role in enumerate(roles)]
    procs = list(workers)
    try:
        await asyncio.gather(*(w.wait_ready_async(args.ready_timeout) for w in workers))
        urls = [w.url for w in workers]
        flags = (["--prefill-workers", urls[0], "--decode-workers", urls[1],
                  "--disagg-min-prompt-tokens", str(args.disagg_min_prompt_tokens)]
                 if disaggregated else ["--workers", ",".join(urls)])
        router = _router(log_dir, f"{tag}-router", flags)
        procs.append(router)
        await router.wait_ready_async(60)
        await _load(router.url, bodies[:2], 2)  # warm both paths
        started = time.perf_counter()
        results = await _load(router.url, bodies, args.concurrency)
        out = _summary(results, bench, time.perf_counter() - started)
        if disaggregated:
            prefill, decode = [await _metrics_page(w.url) for w in workers]
            received = metric_sum(decode, "frota_kv_transfer_bytes_total", direction="received")
            receive_s = metric_sum(decode, "frota_kv_transfer_seconds_sum", direction="receive")
            sent = metric_sum(prefill, "frota_kv_transfer_bytes_total", direction="sent")
            send_s = metric_sum(prefill, "frota_kv_transfer_seconds_sum", direction="send")
            transfers = metric_sum(decode, "frota_kv_transfer_seconds_count",
                                   direction="receive")
            out["kv_transfer"] = {
                "transfers": int(transfers), "bytes": int(received),
                "mean_mb": round(received / max(transfers, 1) / 1e6, 3),
                "gb_per_s_receive": round(received / receive_s / 1e9, 3) if receive_s else None,
                "gb_per_s_send": round(sent / send_s / 1e9, 3) if send_s else None,
                "mean_transfer_ms": round(receive_s / max(transfers, 1) * 1000, 2),
            }
            routes = await _metrics_page(router.url)
            out["routes"] = {k: int(metric_sum(routes, "frota_router_disagg_requests_total",
                                               route=k))
                             for k in ("disaggregated", "colocated_short", "colocated_fallback")}
        return out
    finally:
        for p in procs:
            p.stop()


async def run_disagg(args: argparse.Namespace, log_dir: Path, bench: ModuleType) -> dict[str, Any]:
    """Colocated then disaggregated, same workload; one JSON object."""
    bodies = workload(args)
    colocated = await _run_setup(bench, args, log_dir, False, bodies)
    disaggregated = await _run_setup(bench, args, log_dir, True, bodies)
    return {
        "mode": "disagg", "model": args.disagg_model, "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "workload": {"requests": args.requests, "long_every": args.long_every,
                     "long_chars": args.long_chars, "short_chars": args.short_chars,
                     "max_tokens": args.max_tokens, "concurrency": args.concurrency,
                     "disagg_min_prompt_tokens": args.disagg_min_prompt_tokens},
        "colocated": colocated, "disaggregated": disaggregated,
        "itl_p99_ratio_disagg_over_colocated": round(
            disaggregated["itl_p99_ms"] / colocated["itl_p99_ms"], 3)
        if colocated["itl_p99_ms"] else None,
        "ttft_p50_ratio_disagg_over_colocated": round(
            disaggregated["ttft_p50_ms"] / colocated["ttft_p50_ms"], 3)
        if colocated["ttft_p50_ms"] else None,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("--disagg")
    g.add_argument("--disagg-model", default="smollm2", help="model both setups serve")
    g.add_argument("--long-every", type=int, default=3, help="every Nth request is long")
    g.add_argument("--long-chars", type=int, default=3000)
    g.add_argument("--short-chars", type=int, default=80)
    g.add_argument("--disagg-min-prompt-tokens", type=int, default=128)


if __name__ == "__main__":
    print(json.dumps({"error": "run `python bench/router.py --disagg`"}))
