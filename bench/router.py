"""Router benchmarks; each mode prints one JSON object (`--plot` also draws a PNG).

    python bench/router.py --overhead   # TTFT added by the router, router CPU per request
    python bench/router.py --prefix     # prefix-cache hit rate: round-robin vs prefix-aware
    python bench/router.py --disagg     # colocated vs disaggregated prefill/decode (router_disagg.py)

--overhead measures what a router adds. For each concurrency (`--concurrency`, default
64,256,1000) and for streaming and non-streaming requests (`--streaming`), it runs
`--passes` passes (5); in each, the targets (the worker directly, `frota router`, and
vllm-router when its binary is found: `--vllm-router PATH`, on PATH, or
/tmp/vr/bin/vllm-router from `pip install vllm-router`) take turns on the same load, in
an order that rotates per pass. Each target has one client whose connections stay open
(warmed up first), as the `openai` client's do. A router's added TTFT is paired per
pass (its p50 minus the direct p50 of the same pass, likewise p99), and every figure
is the median over passes with its min-max; Frota against vllm-router is paired per
pass too (`frota_minus_vllm_router`). The stand-in reports its own time to the first
token with each answer; TTFT less that is the request's transit time, on which the
targets are judged (`added_transit_*`). With two cores or more the router under test
runs alone on one core (`taskset`), the load generator and the stand-in worker on the
other; the JSON's `cores` says what shared a core (`--no-pin` turns it off).
`--frota-python PATH` runs Frota's routers on that interpreter (`bash
scripts/image-python.sh` makes the image's; the JSON's `frota_python` names it). `--quick`
is a smoke run (concurrency 64, streaming, 3 passes). By default the worker is a
STAND-IN (this file, `--stand-in-serve`): a server that streams fixed tokens at a fixed
pace and runs no model. It exists to isolate the router's overhead; it says nothing
about model speed. `--backend smollm2` runs the same measurement against a real
`frota worker --model smollm2` (TTFT only: a real worker reports no service time). The
stand-in and the load generator are built on the router's own server and client
(`frota.router.server`, `frota.router.upstream`) because, sharing a core, whatever CPU
they spend queues the requests they measure.

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
proportional to uncached characters). `--routers 2` puts two router replicas (no
shared state) before the same workers and sends each request to the next one, a
chat's turns alternating between them: what a second replica does to the hit rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
# The process harness and the /metrics reader live with the tests, which run the same processes.
sys.path.insert(0, str(ROOT))
import residence  # noqa: E402  (bench/, beside this file)

from frota.router.server import (  # noqa: E402
    Answer,
    HttpServer,
    Request,
    Response,
    ResponseStream,
    open_stream,
)
from frota.router.upstream import UpstreamClient, UpstreamError  # noqa: E402
from tests.metrics_text import prefix_cache_counters, samples  # noqa: E402
from tests.processes import ServingProcess, free_port, frota_argv  # noqa: E402

STAND_IN_LABEL = ("stand-in worker (fixed tokens at a fixed pace, no model): isolates "
                  "router overhead only")
# How a stand-in tells the client its own share of a request's TTFT, the seconds from
# its handler's start to its first token: a comment before a stream's first event, a
# key of a whole answer. The client's TTFT less that is the request's transit time.
SERVICE_COMMENT = b": stand-in service %.9f\n\n"
SERVICE_KEY = "x_stand_in_service"
_SERVICE_PREFIXES = (b": stand-in service ", b'"x_stand_in_service": ')
JSON_HEADERS = (("Content-Type", "application/json"),)
SSE_HEADERS = (("Content-Type", "text/event-stream"),)


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

    async def handle(self, request: Request) -> Answer:
        """The stand-in's endpoints: completions and chat, health, readiness, metrics."""
        received = time.perf_counter()
        if request.method == "GET":
            if request.path == "/metrics":
                return Response(200, (
                    f"vllm:num_requests_running {self.running}\nvllm:num_requests_waiting 0\n"
                    f"vllm:prefix_cache_hits_total {self.hits}\n"
                    f"vllm:prefix_cache_queries_total {self.queries}\n").encode())
            return Response(200, b'{"status": "ok"}', JSON_HEADERS)
        body = json.loads(request.body)
        chat = "messages" in body
        delay = self.ttft
        if self.cache_blocks:
            text = ("\x00".join(f"{m['role']}\n{m['content']}" for m in body["messages"])
                    if chat else body.get("prompt", ""))
            delay += self.lookup(text) * self.prefill_s_per_char
        num_tokens = int(body.get("max_tokens") or self.num_tokens)
        self.running += 1
        try:
            if not body.get("stream"):
                await asyncio.sleep(delay + self.itl * num_tokens)
                text = "tok " * num_tokens
                choice = ({"message": {"role": "assistant", "content": text}} if chat
                          else {"text": text})
                obj = "chat.completion" if chat else "text_completion"
                return Response(200, json.dumps({
                    "id": "x", "object": obj,
                    "choices": [{"index": 0, **choice, "finish_reason": "length"}],
                    SERVICE_KEY: time.perf_counter() - received}).encode(), JSON_HEADERS)
            await asyncio.sleep(delay)
            token, last = _token_events(chat)
            events = [token] * (num_tokens - 1) + [last + b"data: [DONE]\n\n"]
            # The first event carries the stand-in's own time to it, as an SSE comment
            # (which clients ignore): what the client waited beyond that was transit.
            first = SERVICE_COMMENT % (time.perf_counter() - received) + events[0]
            stream = open_stream(request, 200, SSE_HEADERS, first)
            await self.pace(stream, events[1:])
            return stream
        finally:
            self.running -= 1

    async def pace(self, stream: ResponseStream, events: list[bytes]) -> None:
        """Write `events` `itl` apart: each from a timer callback, without waking the
        request's task per token (the cheapest way asyncio has)."""
        if not events:
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        pending = deque(events)

        def step() -> None:
            nonlocal timer
            stream.write(pending.popleft())
            if pending:
                timer = loop.call_later(self.itl, step)
            else:
                done.set_result(None)

        timer = loop.call_later(self.itl, step)
        try:
            await done
        finally:
            timer.cancel()  # the client left: stop writing

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
    """A stand-in on the router's own HTTP server (`frota.router.server`), which costs
    it less than half the CPU per stream aiohttp's did: it shares a core with the load
    generator, and what it spends shows up as noise in every latency measured."""
    stand_in = StandIn(args.stand_in_ttft, args.stand_in_itl, args.max_tokens,
                       args.stand_in_cache_blocks, args.stand_in_prefill_us_per_char / 1e6)
    fast_event_loop()

    async def serve() -> None:
        server = HttpServer(stand_in.handle)
        await server.listen("127.0.0.1", args.port)
        await asyncio.Event().wait()  # until the benchmark stops the process
    asyncio.run(serve())


# --------------------------------------------------------------------------- processes

def start_worker(args: argparse.Namespace, name: str, log_dir: Path, *,
                 cache_blocks: int = 0, num_kv_blocks: int | None = None,
                 threads: int | None = None,
                 cores: list[int] | None = None) -> ServingProcess:
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
    return ServingProcess(name, pinned(argv, cores), port, log_dir / f"{name}.log", env)


def start_router(workers: list[ServingProcess], policy: str, log_dir: Path,
                 name: str = "router", extra: list[str] | None = None,
                 cores: list[int] | None = None, src: str | None = None,
                 python: str | None = None) -> ServingProcess:
    """`frota router` before `workers`; `src`: from another checkout of Frota;
    `python`: run by that interpreter (`--frota-python`) rather than this one."""
    port = free_port()
    argv = router_argv(python, "--policy", policy, "--max-inflight", "0",
                       "--workers", ",".join(w.url for w in workers), "--log-level", "warning",
                       *(extra or []), port=port)
    return ServingProcess(name, pinned(argv, cores), port, log_dir / f"{file_label(name)}.log",
                          router_env(src, python))


def router_argv(python: str | None, *args: str, port: int) -> list[str]:
    """`frota router ARGS`, run by `python` (None: this interpreter)."""
    argv = frota_argv("router", *args, port=port)
    if python:
        argv[0] = python
    return argv


def router_env(src: str | None, python: str | None) -> dict[str, str] | None:
    """What a Frota router from checkout `src` (None: this one) run by `python` (None:
    this interpreter, where this checkout is installed) needs in its environment."""
    return checkout_env(src or str(ROOT)) if src or python else None


def interpreter(python: str | None) -> dict[str, str]:
    """Which Python runs Frota's routers: the image's (`scripts/image-python.sh`) measures
    the router as it ships, where a development interpreter may be a slower build."""
    # A build configured with a shared libpython may still link its own binary statically
    # (Debian's does): what the process maps says which it runs on.
    probe = ("import json, platform, sys; print(json.dumps({'executable': sys.executable, "
             "'version': platform.python_version(), 'base': sys.base_prefix, 'libpython': "
             "'shared' if 'libpython' in open('/proc/self/maps').read() else 'static'}))")
    done = subprocess.run([python or sys.executable, "-c", probe], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def file_label(name: str) -> str:
    """`name` (a target such as `frota@<commit>`) made safe as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def checkout_env(src: str) -> dict[str, str]:
    """What runs `frota` from the checkout at `src` rather than the installed one."""
    return {"PYTHONPATH": str(Path(src).resolve() / "src")}


def checkout_name(src: str) -> str:
    """The commit a checkout is at (short), or its path when it is not a git checkout."""
    done = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else src


def find_vllm_router(path: str | None) -> str | None:
    if path:
        return path
    for candidate in (shutil.which("vllm-router"), "/tmp/vr/bin/vllm-router"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def start_vllm_router(binary: str, workers: list[ServingProcess],
                      log_dir: Path, cores: list[int] | None = None) -> ServingProcess:
    port = free_port()
    argv = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--worker-urls", *[w.url for w in workers]]
    return ServingProcess("vllm-router", pinned(argv, cores), port,
                          log_dir / "vllm-router.log")


# --------------------------------------------------------------------------- load

@dataclass
class Result:
    ttft: float
    e2e: float
    ok: bool
    text: str = ""
    service: float = float("nan")  # the stand-in's share of `ttft` (`SERVICE_COMMENT`)

    @property
    def transit(self) -> float:
        """TTFT less the worker's own time: what the path to the worker and back took."""
        return self.ttft - self.service


def service_time(data: bytes) -> float:
    """The stand-in's service time reported in `data`, or NaN (another worker)."""
    for prefix in _SERVICE_PREFIXES:
        start = data.find(prefix)
        if start >= 0:
            start += len(prefix)
            end = start
            while end < len(data) and data[end] in b"0123456789.e-":
                end += 1
            return float(data[start:end])
    return float("nan")


async def stream_one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Result:
    """One streaming request; TTFT is the first body chunk, ok means `[DONE]` arrived.
    Deltas are collected only for chat (multi-turn needs the reply)."""
    started = time.perf_counter()
    ttft = service = float("nan")
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
                    service = service_time(chunk)
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
    return Result(ttft, time.perf_counter() - started, tail.rstrip().endswith(b"[DONE]"), text,
                  service)


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

# Which core each process gets, where the machine has two or more: the router being
# measured alone on one, the load generator and the stand-in worker on the other.
# Only one router carries load at a time (the targets take turns), so the two routers
# never compete with each other.
ROUTER_CORE, LOAD_CORE = 1, 0


def core_layout() -> dict[str, Any] | None:
    """The pinning for this machine, or None (one core, or no `taskset`)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or not shutil.which("taskset"):
        return None
    return {"router": [cores[ROUTER_CORE]], "load_generator": [cores[LOAD_CORE]],
            "stand_in_worker": [cores[LOAD_CORE]],
            "shared": "the load generator and the stand-in worker share one core; the "
                      "router under test has the other to itself (the idle router and "
                      "other users' processes are not pinned and may run on either)"}


def pinned(argv: list[str], cores: list[int] | None) -> list[str]:
    """`argv` under `taskset` (exec'd, so the pid, hence the CPU accounting, is the
    server's own, and every thread it starts inherits the mask)."""
    return ["taskset", "-c", ",".join(map(str, cores)), *argv] if cores else argv


async def openai_client_headers() -> list[tuple[str, str]]:
    """The headers the official `openai` client sends with a completion, captured from
    one it sends here (less Host and Content-Length, which the load generator writes).
    A router parses, checks and forwards each one: the load generator sends what a
    router serves in production, not a bare minimum."""
    import openai

    seen: list[tuple[str, str]] = []

    async def capture(request: Request) -> Response:
        seen.extend(request.headers.raw)
        return Response(200, json.dumps({
            "id": "x", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}).encode(),
            JSON_HEADERS)

    server = HttpServer(capture)
    port = await server.listen("127.0.0.1", 0)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-bench",
                           max_retries=0)
    try:
        await asyncio.to_thread(client.completions.create, model="m", prompt="x",
                                max_tokens=1)
    finally:
        client.close()
        await server.close(grace=1.0)
    return [(name, value) for name, value in seen
            if name.lower() not in ("host", "content-length")]


async def request_one(client: UpstreamClient, url: str, body: bytes, stream: bool,
                      headers: list[tuple[str, str]]) -> Result:
    """A streaming request (TTFT: the first body piece) or a non-streaming one (TTFT:
    the whole answer, which is then the first byte that is of any use), on one of
    `client`'s kept-alive connections."""
    started = time.perf_counter()
    response = None
    try:
        response = await client.request(url, "POST", "/v1/completions", headers, body)
        if not stream or response.status != 200:
            data = await response.read()
            elapsed = time.perf_counter() - started
            return Result(elapsed, elapsed, response.status == 200 and b'"choices"' in data,
                          service=service_time(data))
        first = await response.next_chunk()
        ttft = time.perf_counter() - started
        pieces = [first]
        await response.relay(pieces.append)
        tail = b"".join(pieces[-3:]).rstrip()
        return Result(ttft, time.perf_counter() - started, tail.endswith(b"[DONE]"),
                      service=service_time(first))
    except UpstreamError:
        return Result(float("nan"), time.perf_counter() - started, False)
    finally:
        if response is not None:
            response.close()


async def load_on(client: UpstreamClient, url: str, body: dict[str, Any],
                  requests: int, concurrency: int,
                  headers: list[tuple[str, str]]) -> list[Result]:
    """`requests` of `body` with `headers` (`openai_client_headers`) from `concurrency`
    loops, each sending its next request when its last one has ended, as a fixed number
    of users would."""
    data = json.dumps(body).encode()
    numbered = residence.TAG in data  # the prompt gets each request's number there
    template = (data.replace(b"%", b"%%").replace(residence.TAG.replace(b"%", b"%%"),
                                                   residence.TAG) if numbered else data)
    stream = bool(body.get("stream"))
    results: list[Result] = []
    numbers = iter(range(requests))

    async def user() -> None:
        for number in numbers:
            payload = template % number if numbered else data
            results.append(await request_one(client, url, payload, stream, headers))
    await asyncio.gather(*(user() for _ in range(min(concurrency, requests))))
    return results


def load_client() -> UpstreamClient:
    """The load generator's client: the router's own (`frota.router.upstream`), which
    costs a third of aiohttp's CPU per stream. The load generator shares a core with the
    stand-in worker, and every millisecond either spends there queues the requests it
    measures (docs/benchmarks.md, "Overhead")."""
    return UpstreamClient(connect_timeout=30.0, read_timeout=600.0)


def rss_mib(proc: ServingProcess) -> float:
    """Resident memory of the process and its children, MiB."""
    import psutil

    process = psutil.Process(proc.popen.pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]
               ) / 2**20


def spread(values: list[float]) -> dict[str, float]:
    """Median over passes, with min and max."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = (ordered[mid] if len(ordered) % 2
              else (ordered[mid - 1] + ordered[mid]) / 2)
    return {"median": round(median, 3), "min": round(ordered[0], 3),
            "max": round(ordered[-1], 3)}


def minus(per_target: dict[str, list[float]], a: str, b: str) -> list[float]:
    """Target `a`'s figure minus target `b`'s, pass by pass."""
    return [x - y for x, y in zip(per_target[a], per_target[b], strict=True)]


def median_interval(diffs: list[float], confidence: float = 0.9) -> dict[str, Any]:
    """A confidence interval for the median of paired differences that assumes nothing
    about their distribution (the sign test's): the order statistics d(k) and d(n-k+1)
    for the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at least
    `confidence`. With 5 passes it is the min-max, at 94%; with 15, the 4th to 12th, at
    96%. The verdict is "better" (Frota's side below zero) or "worse" only when the
    whole interval is on one side of zero, else "tie"; with fewer than 5 passes there
    is no interval at this confidence."""
    ordered = sorted(diffs)
    n = len(ordered)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = max((k for k in range(1, (n + 1) // 2 + 1) if coverage(k) >= confidence),
            default=0)
    if k == 0:
        return {"verdict": "too few passes", "interval": None, "coverage": None}
    low, high = ordered[k - 1], ordered[n - k]
    verdict = "better" if high < 0 else "worse" if low > 0 else "tie"
    return {"verdict": verdict, "interval": [round(low, 3), round(high, 3)],
            "coverage": round(coverage(k), 3)}


async def overhead(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """For each concurrency and each of streaming / non-streaming, `--passes` passes; in
    each pass every target (direct, Frota, vllm-router) runs the same load in turn, in
    an order that rotates per pass. A router's added TTFT is paired: its pass's p50
    (p99) minus the direct p50 (p99) of the same pass, so drift over the run (other
    users, thermal, the page cache) hits both sides of each difference alike. Figures
    are medians over passes with min-max; Frota against vllm-router is also paired
    per pass (`frota_minus_vllm_router`)."""
    layout = core_layout() if not args.no_pin else None
    if layout:
        os.sched_setaffinity(0, layout["load_generator"])
    router_cores = layout["router"] if layout else None
    worker = start_worker(args, "worker", log_dir,
                          cores=layout["stand_in_worker"] if layout else None)
    procs = [worker]
    args.log_dir, args.worker_port = log_dir, worker.port
    args.load_cores = layout["load_generator"] if layout else None
    try:
        await worker.wait_ready_async(args.ready_timeout)
        router = start_router([worker], "round-robin", log_dir, cores=router_cores,
                              python=args.frota_python)
        procs.append(router)
        await router.wait_ready_async(60)
        vllm_binary = find_vllm_router(args.vllm_router)
        routers: dict[str, ServingProcess] = {"frota": router}
        for src in args.frota_src:  # other builds of Frota, to judge a change
            name = f"frota@{checkout_name(src)}"
            other = start_router([worker], "round-robin", log_dir, name=name,
                                 cores=router_cores, src=src, python=args.frota_python)
            procs.append(other)
            await other.wait_ready_async(60)
            routers[name] = other
        if vllm_binary:
            vllm_router = start_vllm_router(vllm_binary, [worker], log_dir, cores=router_cores)
            procs.append(vllm_router)
            await vllm_router.wait_ready_async(60, path="/health")
            routers["vllm-router"] = vllm_router
        targets = {"direct": worker.url, **{name: p.url for name, p in routers.items()}}
        args.headers = await openai_client_headers()
        modes = {"stream": [True], "no-stream": [False], "both": [True, False]}[args.streaming]
        runs = []
        distributions: dict[str, list[float]] = {}
        for concurrency in [int(c) for c in str(args.concurrency).split(",")]:
            for stream in modes:
                run, ttfts = await overhead_run(args, targets, routers, concurrency, stream)
                runs.append(run)
                distributions.setdefault(f"{concurrency}-{'stream' if stream else 'full'}",
                                         ttfts["frota"])
                print(json.dumps(run), file=sys.stderr, flush=True)  # progress
        out: dict[str, Any] = {
            "mode": "overhead",
            "backend": STAND_IN_LABEL if args.backend == "stand-in" else "frota worker smollm2",
            "max_tokens": args.max_tokens, "passes": args.passes,
            "request_headers": [name for name, _ in args.headers],
            "stand_in_ttft_ms": args.stand_in_ttft * 1000,
            "stand_in_itl_ms": args.stand_in_itl * 1000,
            "frota_python": interpreter(args.frota_python),
            "cpu_count": os.cpu_count(), "cores": layout or "not pinned",
            "cpu_clock": "each router process's CPU-time clock, in nanoseconds",
            "vllm_router": vllm_binary or "not found (pip install vllm-router; "
                                          "pass --vllm-router PATH)",
            "runs": runs,
            "targets": "added TTFT p50 and p99 (judged on transit, paired per pass, "
                       "median over passes) <= vllm-router's, CPU per request <= "
                       "vllm-router's, at every concurrency",
            "meets_targets": all(r.get("meets_targets", False) for r in runs),
            # Where the paired interval (sign test) is all above zero: Frota worse
            # beyond what the passes' spread allows. A median above zero whose interval
            # holds zero is a tie, which `meets_targets` (medians <= 0) counts as a miss.
            "frota_worse": [f"{r['concurrency']} {'streaming' if r['streaming'] else 'whole'}"
                            f": {key}" for r in runs for key in r.get("frota_worse", [])],
            # Other processes' load skews every latency here; read the numbers with it.
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        if args.plot:
            plot_overhead(out, args.plot)
        return out
    finally:
        for proc in reversed(procs):
            proc.stop()


async def overhead_run(args: argparse.Namespace, targets: dict[str, str],
                       routers: dict[str, ServingProcess], concurrency: int,
                       stream: bool) -> tuple[dict[str, Any], dict[str, list[float]]]:
    prompt = "Say hello to the router benchmark. " + residence.TAG.decode()
    body = {"model": args.model_name, "prompt": prompt,
            "max_tokens": args.max_tokens, "stream": stream, "temperature": 0}
    per_pass = max(concurrency, args.requests // args.passes)
    names = list(targets)
    # Per measure (TTFT, and transit where the worker reports its service time), per
    # quantile, per target: one figure per pass.
    measures = ("ttft", "transit")
    quantiles: dict[str, dict[int, dict[str, list[float]]]] = {
        m: {q: {n: [] for n in names} for q in (50, 99)} for m in measures}
    cpu: dict[str, list[float]] = {n: [] for n in routers}
    rss: dict[str, float] = dict.fromkeys(routers, 0.0)
    ttfts: dict[str, list[float]] = {n: [] for n in names}
    failures = dict.fromkeys(names, 0)
    # With --residence: each router's time holding a request (`residence`), per leg.
    held = {leg: {q: {n: [] for n in routers} for q in (50, 99)}
            for leg in ("total", "request", "answer")}
    matched = dict.fromkeys(routers, 0)
    # Each target has one client whose connections stay open (as the openai client's
    # do), warmed up with one wave first.
    clients = {name: load_client() for name in names}
    try:
        for name, url in targets.items():
            await load_on(clients[name], url, body, concurrency, concurrency, args.headers)
        for index in range(args.passes):
            order = names[index % len(names):] + names[:index % len(names)]
            for name in order:
                proc = routers.get(name)
                with contextlib.ExitStack() as capturing:
                    if args.residence:  # every target's passes, so that all bear its cost
                        pcap = args.log_dir / f"{file_label(name)}.pcap"
                        capturing.enter_context(residence.Capture(
                            pcap, [args.worker_port, *([proc.port] if proc else [])],
                            args.load_cores))
                    before = proc.cpu_seconds() if proc else 0.0
                    results = await load_on(clients[name], targets[name], body, per_pass,
                                            concurrency, args.headers)
                    after = proc.cpu_seconds() if proc else 0.0
                if args.residence:
                    if proc:
                        legs = residence.residence(pcap, proc.port, args.worker_port,
                                                   _SERVICE_PREFIXES)
                        for leg, values in (("total", legs.total),
                                            ("request", legs.request),
                                            ("answer", legs.answer)):
                            for q in (50, 99):
                                held[leg][q][name].append(pct(values, q))
                        matched[name] += len(legs.request)
                    pcap.unlink()
                if proc:
                    cpu[name].append((after - before) / per_pass * 1000)
                    rss[name] = max(rss[name], rss_mib(proc))
                ok = [r for r in results if r.ok]
                failures[name] += len(results) - len(ok)
                ttfts[name] += [r.ttft for r in ok]
                for measure in measures:
                    values = [getattr(r, measure) for r in ok]
                    for q in (50, 99):
                        quantiles[measure][q][name].append(pct(values, q) * 1000)
    finally:
        for client in clients.values():
            await client.close()
    # Transit is reported where the worker told its service time for every request.
    measured = [m for m in measures
                if all(v == v for v in quantiles[m][50]["direct"])]
    added = {m: {q: {name: minus(per_target, name, "direct") for name in routers}
                 for q, per_target in quantiles[m].items()} for m in measured}
    p50, p99 = quantiles["ttft"][50], quantiles["ttft"][99]
    run: dict[str, Any] = {
        "concurrency": concurrency, "streaming": stream, "requests_per_pass": per_pass,
        "direct_ttft_ms": {"p50": spread(p50["direct"]), "p99": spread(p99["direct"])},
        "failed_requests": failures}
    if "transit" in measured:
        run["direct_transit_ms"] = {f"p{q}": spread(quantiles["transit"][q]["direct"])
                                    for q in (50, 99)}
    for name in routers:
        run[name] = {**{f"added_{m}_p{q}_ms": spread(added[m][q][name])
                        for m in measured for q in (50, 99)},
                     "ttft_p50_ms": spread(p50[name]), "ttft_p99_ms": spread(p99[name]),
                     "cpu_ms_per_request": spread(cpu[name]),
                     "peak_rss_mib": round(rss[name], 1)}
        if args.residence:
            run[name]["residence_ms"] = {f"{leg}_p{q}": spread(per_name[name])
                                         for leg, per_q in held.items()
                                         for q, per_name in per_q.items()}
            run[name]["residence_requests_matched"] = matched[name]
    for other in routers:
        if other == "frota":
            continue
        paired = {f"added_{m}_p{q}_ms": minus(added[m][q], "frota", other)
                  for m in measured for q in (50, 99)}
        if args.residence:
            paired.update({f"residence_p{q}_ms": minus(held["total"][q], "frota", other)
                           for q in (50, 99)})
        paired["cpu_ms_per_request"] = minus(cpu, "frota", other)
        run[f"frota_minus_{other.replace('-', '_')}"] = {
            **{key: spread(d) for key, d in paired.items()},
            **{f"passes_frota_{key.removeprefix('added_').removesuffix('_ms')}_not_worse":
               sum(x <= 0 for x in d)
               for key, d in paired.items() if key != "cpu_ms_per_request"},
            "verdicts": {key: median_interval(d) for key, d in paired.items()}}
    if "vllm-router" in routers:
        # Judged on transit where it is measured (the worker's own time, its timers and
        # its event loop on a shared core, is noise in TTFT that no router adds or
        # removes), paired per pass: Frota not worse than vllm-router in the median pass.
        judged = measured[-1]
        diff = run["frota_minus_vllm_router"]
        keys = (f"added_{judged}_p50_ms", f"added_{judged}_p99_ms", "cpu_ms_per_request")
        run["judged_on"] = f"{judged}, paired per pass"
        run["meets_targets"] = (all(diff[key]["median"] <= 0 for key in keys)
                                and failures["frota"] == 0)
        run["frota_worse"] = [key for key in keys
                              if diff["verdicts"][key]["verdict"] == "worse"]
    return run, ttfts


def plot_overhead(out: dict[str, Any], path: str) -> None:
    """One panel per figure (added transit, or TTFT, p50 and p99; with --residence the
    router's residence p50 and p99; CPU per request) against concurrency, streaming and
    non-streaming, each router a line with its min-max over passes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"frota": "tab:blue", "vllm-router": "tab:orange"}
    measure = "transit" if "direct_transit_ms" in out["runs"][0] else "ttft"
    figures = [(f"added_{measure}_p50_ms", f"added {measure} p50 (ms)"),
               (f"added_{measure}_p99_ms", f"added {measure} p99 (ms)"),
               ("cpu_ms_per_request", "router CPU per request (ms)")]
    if "residence_ms" in out["runs"][0].get("frota", {}):
        figures[2:2] = [("residence_ms.total_p50", "residence p50 (ms)"),
                        ("residence_ms.total_p99", "residence p99 (ms)")]
    rows = 1 if len(figures) <= 3 else 2
    cols = -(-len(figures) // rows)
    fig, grid = plt.subplots(rows, cols, figsize=(4.7 * cols, 4 * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(figures):]:
        ax.set_visible(False)
    for ax, (key, title) in zip(axes, figures, strict=False):
        for name, color in colors.items():
            for stream, style in ((True, "-"), (False, "--")):
                runs = [r for r in out["runs"] if r["streaming"] == stream and name in r]
                if not runs:
                    continue
                x = [r["concurrency"] for r in runs]
                figure = [_figure(r[name], key) for r in runs]
                med = [f["median"] for f in figure]
                low = [m - f["min"] for m, f in zip(med, figure, strict=True)]
                high = [f["max"] - m for m, f in zip(med, figure, strict=True)]
                ax.errorbar(x, med, yerr=[low, high], color=color, linestyle=style,
                            marker="o", capsize=3,
                            label=f"{name}, {'streaming' if stream else 'non-streaming'}")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("concurrency")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"router overhead, stand-in worker, {out['passes']} passes "
                 f"(median, min-max), load {out['load_average_1m']}")
    fig.tight_layout()
    fig.savefig(path)


def _figure(figures: dict[str, Any], key: str) -> dict[str, float]:
    """`figures[key]`, where a dotted key reads a nested one."""
    for part in key.split("."):
        figures = figures[part]
    return figures


# --------------------------------------------------------------------------- --prefix

async def metrics_page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as r:
        return await r.text()


async def scrape_prefix(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    return prefix_cache_counters(await metrics_page(session, url))


def words(rng: random.Random, n: int) -> str:
    vocab = ["alpha", "beta", "gamma", "delta", "router", "cache", "token", "prefix", "block", "worker", "fleet", "model", "prompt", "stream", "queue", "batch", "river", "mountain", "orange", "violet", "copper", "silver"]
    return " ".join(rng.choice(vocab) for _ in range(n))


class Alternate:
    """The routers' URLs in turn, one per request (`--routers`): consecutive requests,
    a chat's turns included, go to different routers, as behind a Service."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self._next = urls, 0

    def __call__(self) -> str:
        url = self.urls[self._next % len(self.urls)]
        self._next += 1
        return url


async def conversations(urls: Alternate, args: argparse.Namespace) -> list[Result]:
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
                    result = await stream_one(session, urls(), body)
                    results.append(result)
                    messages.append({"role": "assistant", "content": result.text or "ok"})
        await asyncio.gather(*(chat(i) for i in range(args.conversations)))
    return results


async def shared_prefix(urls: Alternate, args: argparse.Namespace) -> list[Result]:
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
    semaphore = asyncio.Semaphore(args.concurrency)
    async with client_session() as session:
        async def one(body: dict[str, Any]) -> Result:
            async with semaphore:
                return await stream_one(session, urls(), body)
        return await asyncio.gather(*(one(b) for b in bodies))


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
        "workers": 2, "routers": args.routers, "frota_python": interpreter(args.frota_python),
        "workload": workload_description(args),
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
            routers = [start_router(workers, policy, log_dir, name=f"router{r}-{policy}",
                                    extra=extra, python=args.frota_python)
                       for r in range(args.routers)]
            procs += routers
            for router in routers:
                await router.wait_ready_async(60)
            baseline = await warm_up(workers, args)
            started = time.perf_counter()
            load = shared_prefix if args.workload == "shared-prefix" else conversations
            results = await load(Alternate([r.url for r in routers]), args)
            elapsed = time.perf_counter() - started
            async with aiohttp.ClientSession() as session:
                after = [await scrape_prefix(session, w.url) for w in workers]
                counts = [(h - h0, q - q0)
                          for (h, q), (h0, q0) in zip(after, baseline, strict=True)]
                decisions: dict[str, float] = {}
                for router in routers:
                    for kind, n in (await routing_decisions(session, router.url)).items():
                        decisions[kind] = decisions.get(kind, 0) + n
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
    parser.add_argument("--concurrency", default=None,
                        help="in flight at once; --overhead: a comma list (64,256,1000)")
    parser.add_argument("--streaming", choices=["both", "stream", "no-stream"],
                        default="both", help="--overhead: streaming requests, "
                        "non-streaming ones, or both")
    parser.add_argument("--quick", action="store_true",
                        help="--overhead: a smoke run (concurrency 64, streaming, 3 passes)")
    parser.add_argument("--no-pin", action="store_true",
                        help="--overhead: do not pin the processes to cores with taskset")
    parser.add_argument("--requests", type=int, default=None,
                        help="--overhead: requests per target and concurrency, over all "
                        "passes (at least one wave of `concurrency` per pass; 2560); "
                        "--disagg: requests (24)")
    parser.add_argument("--passes", type=int, default=5,
                        help="--overhead: the targets take turns this many times")
    parser.add_argument("--residence", action="store_true",
                        help="--overhead: also each router's time holding a request, from "
                             "packet timestamps on lo (tcpdump; needs root)")
    parser.add_argument("--plot", default=None,
                        help="draw a PNG: --overhead the TTFT distributions and router CPU, "
                        "--prefix hit rate and TTFT by KV-cache size")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--model-name", default="smollm2")
    parser.add_argument("--vllm-router", default=None, help="path of the vllm-router binary")
    parser.add_argument("--frota-python", default=None,
                        help="the interpreter that runs Frota's routers (default: this "
                             "one); `bash scripts/image-python.sh` prints the image's")
    parser.add_argument("--frota-src", action="append", default=[],
                        help="--overhead: also another checkout of Frota (its src/), as "
                             "the target frota@<commit>, to judge a change")
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
    parser.add_argument("--routers", type=int, default=1,
                        help="--prefix: router replicas over the same workers, each "
                        "request to the next (as a Service spreads connections)")
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
        args.concurrency = int(args.concurrency or 6)
        args.max_tokens = args.max_tokens or 32
        args.requests = args.requests or 24
        args.max_num_seqs = min(args.max_num_seqs, 16)
    elif args.overhead:
        fast_event_loop()
        args.backend = args.backend or "stand-in"
        if args.quick:
            args.concurrency, args.streaming = args.concurrency or "64", "stream"
            args.passes, args.requests = 3, args.requests or 384
        args.requests = args.requests or 2560
        args.concurrency = args.concurrency or "64,256,1000"
        args.max_tokens = args.max_tokens or 32
    else:
        args.backend = args.backend or "smollm2"
        args.concurrency = int(args.concurrency or 8)
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
