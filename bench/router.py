"""Router benchmarks; each mode prints one JSON object (`--plot` also draws a PNG).

    python bench/router.py --overhead   # TTFT added by the router, router CPU per request
    python bench/router.py --prefix     # prefix-cache hit rate: round-robin vs prefix-aware
    python bench/router.py --disagg     # colocated vs disaggregated prefill/decode (router_disagg.py)

--overhead runs the same load (streaming, concurrency 64) against a worker
directly and through `frota router`, in one run, the targets taking turns over
`--passes`, and reports the TTFT difference. Each target has one client whose
connections stay open (warmed up first), as the `openai` client's do; each pass
also sends one burst on new connections, reported apart (`cold_connections`). By
default the worker is a STAND-IN (this file, `--stand-in-serve`): an aiohttp
server that streams fixed tokens at a fixed pace and runs no model. It exists to
isolate the router's overhead; it says nothing about model speed. `--backend
smollm2` runs the same measurement against a real `frota worker --model smollm2`.
When the `vllm-router` binary is found (`--vllm-router PATH`, or on PATH), the
same load also runs through it, with its CPU per request.

--prefix starts two workers and runs a workload through the router twice, with
round-robin and with prefix-aware, restarting the workers in between so both
start with empty caches (after `--warmup` requests that share nothing with the
workload and are not counted). `--workload shared-prefix` (the default): `--groups` tenants, each
with its own long system prompt, `--prompts-per-group` questions each, shuffled
(SGLang's "generated shared prefix"). `--workload chat`: multi-turn chats over
one short system prompt, users thinking between turns (`--think-time`) so that
conversations do not move in lockstep. Hit rates come from the workers' own
`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`. Workers are real SmolLM2
workers that split the cores between them (two workers on two cores: one torch
thread each; more would make their OpenMP threads spin against each other), whose KV
cache (`--num-kv-blocks`; a comma list sweeps sizes) is smaller than the
workload's working set, which is where cache-aware routing pays: round-robin
makes every worker cache everything. `--backend stand-in` runs it on stand-ins
with a SIMULATED prefix cache (an LRU over 64-character blocks, prefill time
proportional to uncached characters).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
# The process harness and the /metrics reader live with the tests, which run the same processes.
sys.path.insert(0, str(ROOT))
from tests.metrics_text import prefix_cache_counters, samples  # noqa: E402
from tests.processes import ServingProcess, free_port, frota_argv  # noqa: E402

STAND_IN_LABEL = ("stand-in worker (fixed tokens at a fixed pace, no model): isolates "
                  "router overhead only")


# --------------------------------------------------------------------------- stand-in worker

@dataclass
class StandIn:
    """A fake worker: streams `num_tokens` chunks, `itl` apart, after `ttft` (+ simulated
    prefill of uncached characters when `cache_blocks` > 0)."""

    ttft: float
    itl: float
    num_tokens: int
    cache_blocks: int = 0
    prefill_s_per_char: float = 0.0
    cache: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    hits: int = 0
    queries: int = 0
    running: int = 0

    def lookup(self, text: str) -> int:
        """Simulated prefix cache over 64-char blocks (a token is ~4 chars): returns
        the number of uncached characters and counts hits/queries in 'tokens'."""
        data, digest, cached, still_hitting = text.encode(), b"", 0, True
        for start in range(0, len(data) - len(data) % 64, 64):
            import hashlib
            digest = hashlib.blake2b(digest + data[start:start + 64], digest_size=8).digest()
            if still_hitting and digest in self.cache:
                cached += 64
                self.cache.move_to_end(digest)
            else:
                still_hitting = False
                self.cache[digest] = None
        while len(self.cache) > self.cache_blocks:
            self.cache.popitem(last=False)
        self.queries += len(data) // 4
        self.hits += cached // 4
        return len(data) - cached

    async def generate(self, request: Any) -> Any:
        from aiohttp import web
        body = await request.json()
        chat = "messages" in body
        delay = self.ttft
        if self.cache_blocks:
            text = ("\x00".join(f"{m['role']}\n{m['content']}" for m in body["messages"])
                    if chat else body.get("prompt", ""))
            delay += self.lookup(text) * self.prefill_s_per_char
        num_tokens = int(body.get("max_tokens") or self.num_tokens)
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.running += 1
        try:
            if not body.get("stream"):
                await asyncio.sleep(delay + self.itl * num_tokens)
                text = "tok " * num_tokens
                choice = ({"message": {"role": "assistant", "content": text}} if chat
                          else {"text": text})
                return web.json_response({"id": "x", "object": obj.removesuffix(".chunk"),
                                          "choices": [{"index": 0, **choice,
                                                       "finish_reason": "length"}]})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(delay)
            token, last = _token_events(chat)
            for _ in range(num_tokens - 1):
                await response.write(token)
                await asyncio.sleep(self.itl)
            await response.write(last)
            await response.write(b"data: [DONE]\n\n")
            return response
        finally:
            self.running -= 1

    def app(self) -> Any:
        from aiohttp import web

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=(
                f"vllm:num_requests_running {self.running}\nvllm:num_requests_waiting 0\n"
                f"vllm:prefix_cache_hits_total {self.hits}\n"
                f"vllm:prefix_cache_queries_total {self.queries}\n"))

        app = web.Application()
        app.router.add_get("/ready", ok)
        app.router.add_get("/health", ok)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        return app


def _token_events(chat: bool) -> tuple[bytes, bytes]:
    """A stand-in's token event and its last one (with `finish_reason`), encoded once:
    the stand-in shares the CPU with the router it measures, so it spends as little
    as it can."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    delta = {"delta": {"content": "tok "}} if chat else {"text": "tok "}
    events = []
    for finish in (None, "length"):
        chunk = {"id": "x", "object": obj,
                 "choices": [{"index": 0, **delta, "finish_reason": finish}]}
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return events[0], events[1]


def fast_event_loop() -> None:
    """uvloop for the stand-ins and the load generator when it is installed: they share
    the cores with the router they measure."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def serve_stand_in(args: argparse.Namespace) -> None:
    from aiohttp import web
    stand_in = StandIn(args.stand_in_ttft, args.stand_in_itl, args.max_tokens,
                       args.stand_in_cache_blocks, args.stand_in_prefill_us_per_char / 1e6)
    fast_event_loop()
    web.run_app(stand_in.app(), host="127.0.0.1", port=args.port, access_log=None,
                print=None)


# --------------------------------------------------------------------------- processes

def start_worker(args: argparse.Namespace, name: str, log_dir: Path, *,
                 cache_blocks: int = 0, num_kv_blocks: int | None = None,
                 threads: int | None = None) -> ServingProcess:
    """A stand-in (`cache_blocks`: its simulated prefix cache) or a real worker
    (`num_kv_blocks`: its KV cache size; None sizes it from memory; `threads`: its
    torch intra-op threads, so that workers sharing the machine do not oversubscribe
    the cores, each one's OpenMP threads spinning while the other's run)."""
    port = free_port()
    if args.backend == "stand-in":
        argv = [sys.executable, __file__, "--stand-in-serve", "--port", str(port),
                "--max-tokens", str(args.max_tokens),
                "--stand-in-ttft", str(args.stand_in_ttft),
                "--stand-in-itl", str(args.stand_in_itl),
                "--stand-in-cache-blocks", str(cache_blocks),
                "--stand-in-prefill-us-per-char", str(args.stand_in_prefill_us_per_char)]
    else:
        argv = frota_argv("worker", "--model", "smollm2", "--max-num-seqs",
                          str(args.max_num_seqs), port=port)
        if num_kv_blocks:
            argv += ["--num-kv-blocks", str(num_kv_blocks)]
    env = {"OMP_NUM_THREADS": str(threads)} if threads else None
    return ServingProcess(name, argv, port, log_dir / f"{name}.log", env)


def start_router(workers: list[ServingProcess], policy: str, log_dir: Path,
                 name: str = "router", extra: list[str] | None = None) -> ServingProcess:
    port = free_port()
    argv = frota_argv("router", "--policy", policy, "--max-inflight", "0",
                      "--workers", ",".join(w.url for w in workers), "--log-level", "warning",
                      *(extra or []), port=port)
    return ServingProcess(name, argv, port, log_dir / f"{name}.log")


def find_vllm_router(path: str | None) -> str | None:
    if path:
        return path
    for candidate in (shutil.which("vllm-router"), "/tmp/vr/bin/vllm-router"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def start_vllm_router(binary: str, workers: list[ServingProcess],
                      log_dir: Path) -> ServingProcess:
    port = free_port()
    argv = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--worker-urls", *[w.url for w in workers]]
    return ServingProcess("vllm-router", argv, port, log_dir / "vllm-router.log")


# --------------------------------------------------------------------------- load

@dataclass
class Result:
    ttft: float
    e2e: float
    ok: bool
    text: str = ""


async def stream_one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Result:
    """One streaming request; TTFT is the first body chunk, ok means `[DONE]` arrived.
    Deltas are collected only for chat (multi-turn needs the reply)."""
    started = time.perf_counter()
    ttft = float("nan")
    tail = b""
    parts: list[bytes] = []
    chat = "messages" in body
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        async with session.post(url + path, json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return Result(ttft, time.perf_counter() - started, False)
            async for chunk in resp.content.iter_any():
                if ttft != ttft:
                    ttft = time.perf_counter() - started
                if chat:
                    parts.append(chunk)
                tail = (tail + chunk)[-32:]
    except (aiohttp.ClientError, TimeoutError):
        return Result(ttft, time.perf_counter() - started, False)
    text = ""
    if chat:
        for event in b"".join(parts).split(b"\n\n"):
            if event.startswith(b"data: {"):
                for choice in json.loads(event[6:]).get("choices", []):
                    text += (choice.get("delta") or {}).get("content") or ""
    return Result(ttft, time.perf_counter() - started, tail.rstrip().endswith(b"[DONE]"), text)


def client_session() -> aiohttp.ClientSession:
    """A load-generator client: unlimited connections, kept alive between requests."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=600))


async def run_load(url: str, bodies: list[dict[str, Any]], concurrency: int,
                   session: aiohttp.ClientSession | None = None) -> list[Result]:
    """`bodies` streamed at `concurrency`; on `session`'s pooled connections when given,
    else on new ones."""
    semaphore = asyncio.Semaphore(concurrency)
    async with contextlib.AsyncExitStack() as stack:
        if session is None:
            session = await stack.enter_async_context(client_session())

        async def one(body: dict[str, Any]) -> Result:
            async with semaphore:
                return await stream_one(session, url, body)
        return await asyncio.gather(*(one(b) for b in bodies))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(v for v in values if v == v)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --------------------------------------------------------------------------- --overhead

async def overhead(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    worker = start_worker(args, "worker", log_dir)
    procs = [worker]
    try:
        await worker.wait_ready_async(args.ready_timeout)
        router = start_router([worker], "round-robin", log_dir)
        procs.append(router)
        await router.wait_ready_async(60)
        vllm_binary = find_vllm_router(args.vllm_router)
        vllm_router = None
        if vllm_binary:
            vllm_router = start_vllm_router(vllm_binary, [worker], log_dir)
            procs.append(vllm_router)
            await vllm_router.wait_ready_async(60, path="/health")
        body = {"model": args.model_name, "prompt": "Say hello to the router benchmark.",
                "max_tokens": args.max_tokens, "stream": True, "temperature": 0}
        targets = {"direct": worker.url, "frota": router.url}
        if vllm_router:
            targets["vllm-router"] = vllm_router.url
        ttfts: dict[str, list[float]] = {k: [] for k in targets}
        cold: dict[str, list[float]] = {k: [] for k in targets}
        failures: dict[str, int] = dict.fromkeys(targets, 0)
        # Steady state: each target has one client whose connections stay open (as the
        # openai client's do), warmed up first. Separately, each pass also sends one
        # burst of `concurrency` requests on new connections, reported as `cold_connections`.
        sessions = {name: client_session() for name in targets}
        warm = [body] * args.concurrency
        for name, url in targets.items():
            await run_load(url, warm, args.concurrency, sessions[name])
        routers = {"frota": router, "vllm-router": vllm_router}
        cpu = dict.fromkeys(targets, 0.0)
        per_pass = max(args.concurrency, args.requests // args.passes)
        try:
            for _ in range(args.passes):  # alternate, so drift hits every target alike
                for name, url in targets.items():
                    proc = routers.get(name)
                    before = proc.cpu_seconds() if proc else 0.0
                    results = await run_load(url, [body] * per_pass, args.concurrency,
                                             sessions[name])
                    if proc:
                        cpu[name] += proc.cpu_seconds() - before
                    ttfts[name] += [r.ttft for r in results if r.ok]
                    failures[name] += sum(not r.ok for r in results)
                    burst = await run_load(url, warm, args.concurrency)  # new connections
                    cold[name] += [r.ttft for r in burst if r.ok]
                    failures[name] += sum(not r.ok for r in burst)
        finally:
            for session in sessions.values():
                await session.close()
        num_requests = per_pass * args.passes
        p = {name: {"p50": pct(v, 50), "p99": pct(v, 99)} for name, v in ttfts.items()}
        added_p50 = p["frota"]["p50"] - p["direct"]["p50"]
        added_p99 = p["frota"]["p99"] - p["direct"]["p99"]
        out: dict[str, Any] = {
            "mode": "overhead",
            "backend": STAND_IN_LABEL if args.backend == "stand-in" else "frota worker smollm2",
            "concurrency": args.concurrency, "requests_per_target": num_requests,
            "max_tokens": args.max_tokens, "streaming": True,
            "direct_ttft_p50_ms": ms(p["direct"]["p50"]),
            "direct_ttft_p99_ms": ms(p["direct"]["p99"]),
            "router_ttft_p50_ms": ms(p["frota"]["p50"]),
            "router_ttft_p99_ms": ms(p["frota"]["p99"]),
            "added_latency_p50_ms": ms(added_p50), "added_latency_p99_ms": ms(added_p99),
            "router_cpu_ms_per_request": round(cpu["frota"] / num_requests * 1000, 3),
            "failed_requests": failures,
            "cold_connections": {  # bursts of `concurrency` requests, each on a new connection
                "requests_per_target": len(cold["direct"]),
                **{f"{name}_ttft_{q}_ms": ms(pct(v, int(q[1:]))) for name, v in cold.items()
                   for q in ("p50", "p99")}},
            "targets": {"added_latency_p50_ms": 2.0, "added_latency_p99_ms": 10.0},
            "meets_targets": ms(added_p50) <= 2.0 and ms(added_p99) <= 10.0,
            "cpu_count": os.cpu_count(),
            # Other processes' load skews every latency here; read the numbers with it.
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        if vllm_router:
            v50 = p["vllm-router"]["p50"] - p["direct"]["p50"]
            v99 = p["vllm-router"]["p99"] - p["direct"]["p99"]
            out["vllm_router"] = {
                "binary": vllm_binary, "added_latency_p50_ms": ms(v50),
                "added_latency_p99_ms": ms(v99),
                "router_cpu_ms_per_request": round(cpu["vllm-router"] / num_requests * 1000, 3),
                "ratio_p50_frota_over_vllm_router": round(added_p50 / v50, 2) if v50 > 0
                else None,
                "ratio_p99_frota_over_vllm_router": round(added_p99 / v99, 2) if v99 > 0
                else None}
        else:
            out["vllm_router"] = "not found (pip install vllm-router; pass --vllm-router PATH)"
        if args.plot:
            plot_overhead(ttfts, out, args.plot)
        return out
    finally:
        for proc in reversed(procs):
            proc.stop()


def plot_overhead(ttfts: dict[str, list[float]], out: dict[str, Any], path: str) -> None:
    """Left: TTFT distributions, direct and through each router. Right: what each router
    adds (p50, p99) and its CPU per request."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"direct": "gray", "frota": "tab:blue", "vllm-router": "tab:orange"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, values in ttfts.items():
        ordered = sorted(v * 1000 for v in values if v == v)
        if ordered:
            left.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))],
                      label=name, color=colors[name])
    left.set_xlabel("TTFT (ms)")
    left.set_ylabel("fraction of requests")
    left.set_title(f"TTFT, streaming, concurrency {out['concurrency']}")
    left.legend()
    routers = {"frota": (out["added_latency_p50_ms"], out["added_latency_p99_ms"],
                         out["router_cpu_ms_per_request"])}
    vllm = out.get("vllm_router")
    if isinstance(vllm, dict):
        routers["vllm-router"] = (vllm["added_latency_p50_ms"], vllm["added_latency_p99_ms"],
                                  vllm["router_cpu_ms_per_request"])
    labels = ["added TTFT p50 (ms)", "added TTFT p99 (ms)", "CPU per request (ms)"]
    for j, (name, values) in enumerate(routers.items()):
        right.bar([i + 0.4 * j for i in range(len(labels))], values, 0.4, label=name,
                  color=colors[name])
    right.axhline(0, color="black", linewidth=0.5)
    right.set_xticks([i + 0.2 for i in range(len(labels))], labels)
    right.set_title(f"router cost (targets: p50 <= 2 ms, p99 <= 10 ms; "
                    f"load {out['load_average_1m']})")
    right.legend()
    fig.tight_layout()
    fig.savefig(path)


# --------------------------------------------------------------------------- --prefix

async def metrics_page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as r:
        return await r.text()


async def scrape_prefix(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    return prefix_cache_counters(await metrics_page(session, url))


def words(rng: random.Random, n: int) -> str:
    vocab = ["alpha", "beta", "gamma", "delta", "router", "cache", "token", "prefix", "block", "worker", "fleet", "model", "prompt", "stream", "queue", "batch", "river", "mountain", "orange", "violet", "copper", "silver"]
    return " ".join(rng.choice(vocab) for _ in range(n))


async def conversations(url: str, args: argparse.Namespace) -> list[Result]:
    """`--conversations` chats, `--turns` each, all sharing one system prompt; each turn
    resends the whole history (with the previous replies), like a chat client does."""
    rng = random.Random(args.seed)
    system = "You are a terse assistant. " + words(rng, args.system_words)
    semaphore = asyncio.Semaphore(args.concurrency)
    connector = aiohttp.TCPConnector(limit=0)
    results: list[Result] = []
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=900)) as session:
        async def chat(index: int) -> None:
            messages = [{"role": "system", "content": system}]
            local = random.Random(args.seed * 1000 + index)
            async with semaphore:
                for turn in range(args.turns):
                    if turn and args.think_time:  # the user reads the reply, then types
                        await asyncio.sleep(local.expovariate(1 / args.think_time))
                    messages.append({"role": "user", "content": f"Conversation {index}, "
                                     f"turn {turn}: {words(local, args.turn_words)}"})
                    body = {"model": args.model_name, "messages": messages, "stream": True,
                            "max_tokens": args.max_tokens, "temperature": 0,
                            "user": f"conv-{index}"}
                    result = await stream_one(session, url, body)
                    results.append(result)
                    messages.append({"role": "assistant", "content": result.text or "ok"})
        await asyncio.gather(*(chat(i) for i in range(args.conversations)))
    return results


async def shared_prefix(url: str, args: argparse.Namespace) -> list[Result]:
    """`--groups` tenants, each with its own long system prompt, `--prompts-per-group`
    one-turn questions each, shuffled and sent `--concurrency` at a time (SGLang's
    "generated shared prefix" workload). The system prompts together outweigh one
    worker's KV cache, and the fleet's together hold them: where they are cached is
    up to the router."""
    rng = random.Random(args.seed)
    systems = [f"You are the assistant of tenant {g}. " + words(rng, args.system_words)
               for g in range(args.groups)]
    bodies = [{"model": args.model_name, "stream": True, "max_tokens": args.max_tokens,
               "temperature": 0, "user": f"tenant-{g}",
               "messages": [{"role": "system", "content": systems[g]},
                            {"role": "user", "content": f"Question {q}: "
                             f"{words(rng, args.question_words)}"}]}
              for g in range(args.groups) for q in range(args.prompts_per_group)]
    rng.shuffle(bodies)
    async with client_session() as session:
        return await run_load(url, bodies, args.concurrency, session)


async def routing_decisions(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The router's `frota_router_routing_decisions_total`, summed by decision kind."""
    out: dict[str, float] = {}
    for sample in samples(await metrics_page(session, url)):
        kind = sample.labels.get("decision")
        if sample.name == "frota_router_routing_decisions_total" and kind:
            out[kind] = out.get(kind, 0) + sample.value
    return out


async def warm_up(workers: list[Any], args: argparse.Namespace) -> list[tuple[float, float]]:
    """Send `--warmup` short requests at once straight to each worker, so the measured
    run does not pay for first-call costs (allocator, kernel selection, batch shapes);
    return each worker's prefix-cache counters afterwards, to subtract. The prompts
    share nothing with the workload's, and the router never sees them."""
    rng = random.Random(args.seed + 1)
    bodies = [{"model": args.model_name, "stream": True, "max_tokens": args.max_tokens,
               "temperature": 0,
               "messages": [{"role": "user", "content": f"Warm-up {i}: {words(rng, 24)}"}]}
              for i in range(args.warmup)]
    async with client_session() as session:
        if bodies:
            for w in workers:
                await run_load(w.url, bodies, len(bodies), session)
        return [await scrape_prefix(session, w.url) for w in workers]


async def prefix(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """One run per `--num-kv-blocks` value; several make a sweep over cache pressure."""
    sizes = [int(v) for v in str(args.num_kv_blocks).split(",")]
    runs = []
    for size in sizes:
        runs.append(await prefix_one(args, log_dir, size))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # progress: one line a run
    if args.plot:
        plot_prefix(runs, args.plot)
    if len(runs) == 1:
        return runs[0]
    return {"mode": "prefix-sweep", "runs": runs}


async def prefix_one(args: argparse.Namespace, log_dir: Path,
                     num_kv_blocks: int) -> dict[str, Any]:
    threads = max(1, (os.cpu_count() or 2) // 2)  # the two workers split the cores
    out: dict[str, Any] = {
        "mode": "prefix",
        "backend": ("stand-in workers with a SIMULATED prefix cache (LRU of 64-char blocks)"
                    if args.backend == "stand-in" else "frota worker smollm2"),
        "workers": 2, "workload": workload_description(args),
        "concurrency": args.concurrency, "num_kv_blocks": num_kv_blocks or None,
        "threads_per_worker": threads, "warmup_requests_per_worker": args.warmup,
        "load_average_1m_at_start": round(os.getloadavg()[0], 2)}
    for policy in args.policies.split(","):
        workers = [start_worker(args, f"{policy}-w{i}", log_dir,
                                cache_blocks=args.stand_in_cache_blocks,
                                num_kv_blocks=num_kv_blocks, threads=threads)
                   for i in range(2)]
        procs = list(workers)
        try:
            for w in workers:
                await w.wait_ready_async(args.ready_timeout)
            extra = []
            for flag, value in (("--prefix-balance", args.prefix_balance),
                                ("--prefix-balance-abs", args.prefix_balance_abs),
                                ("--prefix-hot-window", args.prefix_hot_window)):
                if policy == "prefix-aware" and value is not None:
                    extra += [flag, str(value)]
            router = start_router(workers, policy, log_dir, name=f"router-{policy}",
                                  extra=extra)
            procs.append(router)
            await router.wait_ready_async(60)
            baseline = await warm_up(workers, args)
            started = time.perf_counter()
            load = shared_prefix if args.workload == "shared-prefix" else conversations
            results = await load(router.url, args)
            elapsed = time.perf_counter() - started
            async with aiohttp.ClientSession() as session:
                after = [await scrape_prefix(session, w.url) for w in workers]
                counts = [(h - h0, q - q0)
                          for (h, q), (h0, q0) in zip(after, baseline, strict=True)]
                decisions = await routing_decisions(session, router.url)
            hits, queries = sum(c[0] for c in counts), sum(c[1] for c in counts)
            ttfts = [r.ttft for r in results if r.ok]
            out[policy] = {
                "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
                "prefix_cache_hits": hits, "prefix_cache_queries": queries,
                "ttft_p50_ms": ms(pct(ttfts, 50)), "ttft_p99_ms": ms(pct(ttfts, 99)),
                "requests": len(results), "failed": sum(not r.ok for r in results),
                "per_worker_queries": [c[1] for c in counts], "decisions": decisions,
                "elapsed_s": round(elapsed, 2)}
        finally:
            for proc in reversed(procs):
                proc.stop()
    rr, pa = out.get("round-robin"), out.get("prefix-aware")
    if rr and pa and rr["prefix_cache_hit_rate"] and pa["prefix_cache_hit_rate"] is not None:
        out["hit_rate_ratio"] = round(pa["prefix_cache_hit_rate"] / rr["prefix_cache_hit_rate"],
                                      2)
        out["meets_targets"] = (out["hit_rate_ratio"] >= 1.8
                                and pa["ttft_p50_ms"] < rr["ttft_p50_ms"])
    out["targets"] = {"hit_rate_ratio": 1.8, "ttft_p50": "prefix-aware lower"}
    return out


def workload_description(args: argparse.Namespace) -> dict[str, Any]:
    if args.workload == "shared-prefix":
        return {"name": "shared-prefix", "groups": args.groups,
                "prompts_per_group": args.prompts_per_group,
                "system_words": args.system_words, "question_words": args.question_words}
    return {"name": "chat", "conversations": args.conversations, "turns": args.turns,
            "system_words": args.system_words, "turn_words": args.turn_words,
            "think_time_s": args.think_time}


def plot_prefix(runs: list[dict[str, Any]], path: str) -> None:
    """Hit rate and TTFT p50 of both policies against each worker's KV-cache size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(runs, key=lambda r: r["num_kv_blocks"] or 1e9)
    labels = [str(r["num_kv_blocks"]) if r["num_kv_blocks"] else "no limit" for r in runs]
    x = range(len(runs))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    policies = [p for p in ("round-robin", "prefix-aware") if p in runs[0]]  # --policies
    for j, policy in enumerate(policies):
        left.bar([i + 0.4 * j for i in x], [r[policy]["prefix_cache_hit_rate"] for r in runs],
                 0.4, label=policy)
        right.bar([i + 0.4 * j for i in x], [r[policy]["ttft_p50_ms"] for r in runs], 0.4,
                  label=policy)
    for i, r in enumerate(runs):
        if r.get("hit_rate_ratio"):
            left.annotate(f"{r['hit_rate_ratio']}x", (i + 0.4, r["prefix-aware"]
                          ["prefix_cache_hit_rate"]), ha="center", va="bottom")
    left.set_ylim(0, 1.05)
    for ax, title in ((left, "prefix-cache hit rate"), (right, "TTFT p50 (ms)")):
        ax.set_xticks([i + 0.2 for i in x], labels)
        ax.set_xlabel("KV-cache blocks per worker (16 tokens each)")
        ax.set_title(title)
        ax.legend()
    work = runs[0]["workload"]
    fig.suptitle(f"two SmolLM2 workers, {work['groups']} tenants' system prompts x "
                 f"{work['prompts_per_group']} questions" if work["name"] == "shared-prefix"
                 else f"two SmolLM2 workers, {work['conversations']} chats x {work['turns']} "
                 "turns, shared system prompt")
    fig.tight_layout()
    fig.savefig(path)


# --------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--overhead", action="store_true", help="router-added TTFT and CPU")
    mode.add_argument("--prefix", action="store_true", help="round-robin vs prefix-aware")
    mode.add_argument("--disagg", action="store_true",
                      help="colocated vs disaggregated prefill/decode (bench/router_disagg.py)")
    mode.add_argument("--stand-in-serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=["stand-in", "smollm2"], default=None,
                        help="workers: stand-in (default for --overhead) or real smollm2 "
                        "(default for --prefix)")
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None,
                        help="--overhead: requests per target, over all passes (3072); "
                        "--disagg: requests (24)")
    parser.add_argument("--passes", type=int, default=6,
                        help="--overhead: the targets take turns this many times")
    parser.add_argument("--plot", default=None,
                        help="draw a PNG: --overhead the TTFT distributions and router CPU, "
                        "--prefix hit rate and TTFT by KV-cache size")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--model-name", default="smollm2")
    parser.add_argument("--vllm-router", default=None, help="path of the vllm-router binary")
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--num-kv-blocks", default=None,
                        help="--prefix: KV blocks per real worker, smaller than the workload's "
                        "working set (0: sized from memory); a comma list runs a sweep "
                        "(shared-prefix 192: the tenants' prompts are 1.7x one cache; chat 128)")
    parser.add_argument("--workload", choices=["shared-prefix", "chat"],
                        default="shared-prefix",
                        help="--prefix: tenants' long system prompts, or multi-turn chats")
    parser.add_argument("--groups", type=int, default=16,
                        help="shared-prefix: tenants, each with its own system prompt")
    parser.add_argument("--prompts-per-group", type=int, default=16)
    parser.add_argument("--question-words", type=int, default=12)
    parser.add_argument("--policies", default="round-robin,prefix-aware",
                        help="--prefix: the policies to run, in order")
    parser.add_argument("--prefix-balance", type=float, default=None,
                        help="--prefix: the router's --prefix-balance (default: the router's)")
    parser.add_argument("--prefix-balance-abs", type=int, default=None,
                        help="--prefix: the router's --prefix-balance-abs (default: the router's)")
    parser.add_argument("--prefix-hot-window", type=int, default=None,
                        help="--prefix: the router's --prefix-hot-window (default: the router's)")
    parser.add_argument("--warmup", type=int, default=4,
                        help="--prefix: requests sent at once to each worker before the "
                        "measured run (not counted; 0: none)")
    parser.add_argument("--conversations", type=int, default=24, help="chat: conversations")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=None,
                        help="system prompt length (shared-prefix 300, chat 30)")
    parser.add_argument("--turn-words", type=int, default=40)
    parser.add_argument("--think-time", type=float, default=0.5,
                        help="--prefix: mean seconds between a reply and the next turn "
                        "(exponential); without it conversations move in lockstep and "
                        "round-robin keeps sending each one to the same worker")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stand-in-ttft", type=float, default=0.01)
    parser.add_argument("--stand-in-itl", type=float, default=0.02)
    parser.add_argument("--stand-in-cache-blocks", type=int, default=0)
    parser.add_argument("--stand-in-prefill-us-per-char", type=float, default=0.0)
    parser.add_argument("--log-dir", default=None, help="where child process logs go")
    parser.add_argument("--json", default=None, help="also write the JSON here")
    import router_disagg

    router_disagg.add_arguments(parser)
    args = parser.parse_args()

    if args.stand_in_serve:
        args.max_tokens = args.max_tokens or 32
        serve_stand_in(args)
        return 0
    if args.disagg:
        args.concurrency = args.concurrency or 6
        args.max_tokens = args.max_tokens or 32
        args.requests = args.requests or 24
        args.max_num_seqs = min(args.max_num_seqs, 16)
    elif args.overhead:
        fast_event_loop()
        args.backend = args.backend or "stand-in"
        args.requests = args.requests or 3072
        args.concurrency = args.concurrency or 64
        args.max_tokens = args.max_tokens or 32
    else:
        args.backend = args.backend or "smollm2"
        args.concurrency = args.concurrency or 8
        args.max_tokens = args.max_tokens or 12
        shared = args.workload == "shared-prefix"
        args.system_words = args.system_words or (300 if shared else 30)
        args.num_kv_blocks = args.num_kv_blocks or ("192" if shared else "128")
        if args.backend == "stand-in":
            # Simulated cache: each worker holds about 60% of the active conversations'
            # history (so one worker cannot cache everything; two together can), and
            # prefill costs 50 us per uncached character.
            args.stand_in_cache_blocks = args.stand_in_cache_blocks or 100
            args.stand_in_prefill_us_per_char = args.stand_in_prefill_us_per_char or 50.0
            args.stand_in_itl = 0.005
    log_dir = Path(args.log_dir or f"/tmp/frota-bench-router-{os.getpid()}")
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.disagg:
        result = asyncio.run(router_disagg.run_disagg(args, log_dir, sys.modules[__name__]))
    else:
        run = overhead if args.overhead else prefix
        result = asyncio.run(run(args, log_dir))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
