"""Load generator for an OpenAI-compatible endpoint (a worker or the router).

    python bench/serve.py --target http://HOST:PORT --model smollm2 --concurrency 32
    python bench/serve.py --target http://HOST:PORT --rate 8          # Poisson arrivals
    python bench/serve.py --model smollm2 --compare-offline           # spawn a worker, then
                                                                      # run the same requests offline

Requests: prompts are windows of a fixed English text (the GPL-3), lengths
uniform in [32, 512] tokens, outputs uniform in [16, 256] tokens with
`ignore_eos`, sent as token ids to `/v1/completions` with `stream: true`.
Prints one JSON object. Other benchmarks import `make_requests`, `run_load`
and `summarize`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

# The process helpers (spawned worker, tokenizer without weights) live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT_FILES = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL")


@dataclass
class BenchRequest:
    """One request: prompt token ids and how many tokens to generate."""

    prompt_ids: list[int]
    max_tokens: int


@dataclass
class BenchResult:
    """What the client measured for one request."""

    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    error: str | None = None


def corpus_text() -> str:
    for path in TEXT_FILES:
        if Path(path).exists():
            return Path(path).read_text()
    raise SystemExit("bench: no fixed English text found (/usr/share/common-licenses/GPL-3)")


def make_requests(tokenizer: Any, num: int, seed: int = 0, prompt_len: tuple[int, int] = (32, 512),
                  output_len: tuple[int, int] = (16, 256)) -> list[BenchRequest]:
    """`num` requests with uniform prompt/output lengths, prompts cut from the corpus."""
    ids = list(tokenizer.encode(corpus_text()))
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        length = rng.randint(*prompt_len)
        start = rng.randrange(0, max(1, len(ids) - length))
        prompt = (ids * (1 + length // max(1, len(ids))))[start:start + length]
        out.append(BenchRequest(prompt, rng.randint(*output_len)))
    return out


async def _one(session: aiohttp.ClientSession, target: str, model: str,
               req: BenchRequest) -> BenchResult:
    body = {"model": model, "prompt": req.prompt_ids, "max_tokens": req.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    result = BenchResult(ok=False, prompt_tokens=len(req.prompt_ids))
    last: float | None = None
    try:
        async with session.post(f"{target}/v1/completions", json=body) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: {"):
                    continue
                # Parse only chunks that may carry usage or an error: the client shares
                # the CPU with the server it measures, so token chunks are only timed.
                if b'"usage"' in line or b'"error"' in line:
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        result.error = str(chunk["error"])[:200]
                        return result
                    if chunk.get("usage"):
                        result.output_tokens = chunk["usage"]["completion_tokens"]
                    if not any(c.get("text") for c in chunk.get("choices") or []):
                        continue
                elif re.search(rb'"text":\s*""', line):
                    continue
                now = time.perf_counter()
                if last is None:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
        result.ok = result.output_tokens > 0
        if not result.ok:
            result.error = "no tokens"
    except (TimeoutError, aiohttp.ClientError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.latency_s = time.perf_counter() - start
    return result


async def run_load(target: str, model: str, requests: list[BenchRequest],
                   concurrency: int | None = 32, rate: float | None = None,
                   seed: int = 0) -> tuple[list[BenchResult], float]:
    """Closed loop with `concurrency` clients, or open loop with Poisson `rate` req/s.

    Returns the per-request results and the wall time.
    """
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        if rate is None:
            queue = list(reversed(requests))
            results: list[BenchResult] = []

            async def client() -> None:
                while queue:
                    results.append(await _one(session, target, model, queue.pop()))

            await asyncio.gather(*(client() for _ in range(concurrency or 1)))
        else:
            rng = random.Random(seed)
            tasks = []
            for req in requests:
                tasks.append(asyncio.create_task(_one(session, target, model, req)))
                await asyncio.sleep(rng.expovariate(rate))
            results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - start


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(results: list[BenchResult], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [x for r in ok for x in r.itl_s]
    output = sum(r.output_tokens for r in ok)
    errors = [r.error for r in results if not r.ok]
    return {
        "num_requests": len(results),
        "duration_s": round(wall_s, 3),
        "output_tokens": output,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "throughput_tok_per_s": round(output / wall_s, 2) if wall_s else 0.0,
        "req_per_s": round(len(ok) / wall_s, 3) if wall_s else 0.0,
        "ttft_p50_s": _round(_pct(ttft, 50)),
        "ttft_p99_s": _round(_pct(ttft, 99)),
        "itl_p50_s": _round(_pct(itl, 50)),
        "itl_p99_s": _round(_pct(itl, 99)),
        "errors": len(errors),
        "error_examples": sorted(set(e or "" for e in errors))[:3],
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def offline_throughput(engine_kwargs: dict[str, Any], requests: list[BenchRequest]
                       ) -> dict[str, Any]:
    """The same requests through the offline engine (`frota.engine.LLM`), no HTTP."""
    from frota.engine import LLM, SamplingParams

    llm = LLM(**engine_kwargs)
    params = [SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
              for r in requests]
    llm.generate([requests[0].prompt_ids], params[:1])  # warm-up, not timed
    start = time.perf_counter()
    outs = llm.generate([r.prompt_ids for r in requests], params)
    wall = time.perf_counter() - start
    output = sum(len(o.token_ids) for o in outs)
    return {"offline_duration_s": round(wall, 3), "offline_output_tokens": output,
            "offline_throughput_tok_per_s": round(output / wall, 2)}


def use_torch_threads(threads: int | None) -> int:
    """Give the offline run and a spawned worker the same torch intra-op threads.

    Apples to apples: without this the spawned worker ran with the test harness's one
    thread while the offline run took torch's default (every core), and the thread
    difference was reported as HTTP overhead.
    """
    import torch

    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by the spawned worker's torch
    return threads


def load_tokenizer(model: str) -> Any:
    """The model's tokenizer, without loading its weights."""
    from tests.server.harness import load_tokenizer as harness_load_tokenizer

    return harness_load_tokenizer(model)


def _worker_parser() -> argparse.ArgumentParser:
    from frota.server.cli import add_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="base URL; omitted: spawn a `frota worker`")
    parser.add_argument("--model", default="smollm2", help="model name (and what to spawn)")
    parser.add_argument("--served-model-name", help="name to send in `model` (default --model)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--rate", type=float, help="Poisson arrival rate, req/s (open loop)")
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 512))
    parser.add_argument("--output-len", type=int, nargs=2, default=(16, 256))
    parser.add_argument("--engine-args", default="",
                        help="worker/engine flags for a spawned worker and the offline run, "
                             "e.g. '--max-num-seqs 32 --dtype float32'")
    parser.add_argument("--compare-offline", action="store_true",
                        help="also run the same requests offline and report http_overhead_pct")
    parser.add_argument("--threads", type=int,
                        help="torch intra-op threads of the spawned worker and the offline run "
                             "(default: torch's default here)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)

    worker_argv = ["--model", args.model, *shlex.split(args.engine_args)]
    if "--max-num-seqs" not in worker_argv:
        worker_argv += ["--max-num-seqs", str(args.concurrency)]
    from frota.server.cli import engine_kwargs

    engine_kw = engine_kwargs(_worker_parser().parse_args(worker_argv))
    threads = use_torch_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    requests = make_requests(tokenizer, args.num_requests, args.seed, tuple(args.prompt_len),
                             tuple(args.output_len))
    name = args.served_model_name or args.model
    report: dict[str, Any] = {"target": args.target, "model": args.model,
                              "concurrency": None if args.rate else args.concurrency,
                              "rate": args.rate, "torch_threads": threads}
    worker = None
    if args.target is None:
        from tests.server.harness import WorkerProcess

        log_path = Path("bench/out/serve_worker.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        worker = WorkerProcess(args.model, *worker_argv[2:], log_path=log_path)
        worker.wait_ready(timeout_s=600)
        args.target = worker.url
        report["target"] = f"spawned {' '.join(worker_argv)}"
    try:
        # One short request first so lazy initialisation is not measured.
        asyncio.run(run_load(args.target, name, requests[:1], concurrency=1))
        results, wall = asyncio.run(run_load(args.target, name, requests, args.concurrency,
                                             args.rate, args.seed))
    finally:
        if worker is not None:
            worker.stop()
    report.update(summarize(results, wall))
    if args.compare_offline:
        report.update(offline_throughput(engine_kw, requests))
        offline = report["offline_throughput_tok_per_s"]
        report["http_overhead_pct"] = round(
            100.0 * (offline - report["throughput_tok_per_s"]) / offline, 2)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
