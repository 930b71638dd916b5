"""Instructions a router executes per request, counted by callgrind: Frota's router and
vllm-router side by side, non-streaming and streaming, on the same stand-in worker.

    python bench/router_instructions.py                 # prints one JSON object
    python bench/router_instructions.py --frota-src DIR # also another checkout of Frota
    python bench/router_instructions.py --headers bare  # Host, Content-Type, Content-Length
    python bench/router_instructions.py --frota-python "$(bash scripts/image-python.sh)"
                                                        # Frota on the image's interpreter

Why: CPU time per request on a shared 2-core machine moves by 10-20% between runs of the
same build, while the changes worth making to the router's hot path are a few percent.
The number of instructions a process executes in user space for a fixed set of
requests repeats to within 0.5%, so it judges such a change in one run. It leaves out
the kernel (the system calls are the same in both routers: one receive and one send
per request or chunk each way), and an instruction of the interpreter is not an
instruction of Rust, so it ranks changes to one router; the time comparison between
routers stays `bench/router.py --overhead`'s.

How: each router runs under `valgrind --tool=callgrind` (about 50 times slower), is
warmed up with `--warmup` requests, its counters are zeroed (`callgrind_control -z`),
`--requests` requests run at `--concurrency`, and the counters are dumped. The stand-in
worker paces tokens at 2 ms (32 per stream). Needs valgrind (`apt install valgrind`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import router as router_bench  # noqa: E402  (bench/router.py: the stand-in and the load)

from tests.processes import ServingProcess, free_port  # noqa: E402


def callgrind(argv: list[str], out_dir: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--dump-instr=no",
            f"--callgrind-out-file={out_dir}/callgrind.%p", *argv]


def dumped_instructions(out_dir: Path, pid: int) -> int:
    """The instruction count of the dump `callgrind_control -d` wrote (`<file>.1`)."""
    text = (out_dir / f"callgrind.{pid}.1").read_text()
    match = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
    if match is None:
        raise RuntimeError(f"no instruction total in the callgrind dump of {pid}")
    return int(match.group(1))


def control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)


async def count(name: str, argv: list[str], ready_path: str, args: argparse.Namespace,
                stream: bool, log_dir: Path, env: dict[str, str] | None = None) -> float:
    """Thousands of instructions per request of the router `argv` (which listens on the
    port in it), under callgrind."""
    label = router_bench.file_label(name)
    out_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=log_dir))
    port = int(argv[argv.index("--port") + 1])
    proc = ServingProcess(name, callgrind(argv, out_dir), port, log_dir / f"{label}.log", env)
    try:
        await proc.wait_ready_async(300, path=ready_path)
        pid = proc.popen.pid
        body = {"model": args.model_name, "prompt": "hello world " * 20,
                "max_tokens": args.max_tokens, "stream": stream}
        client = router_bench.load_client()
        try:
            await router_bench.load_on(client, proc.url, body, args.warmup, args.concurrency,
                                       args.headers)
            control("-z", pid)
            results = await router_bench.load_on(client, proc.url, body, args.requests,
                                                 args.concurrency, args.headers)
            control("-d", pid)
        finally:
            await client.close()
        failed = sum(not r.ok for r in results)
        if failed:
            raise RuntimeError(f"{name}: {failed} of {args.requests} requests failed")
        return round(dumped_instructions(out_dir, pid) / args.requests / 1e3, 1)
    finally:
        proc.stop()


async def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    args.backend = "stand-in"
    # Host and Content-Length go with every request (the load generator writes them).
    args.headers = (await router_bench.openai_client_headers() if args.headers == "openai"
                    else [("Content-Type", "application/json")])
    worker = router_bench.start_worker(args, "stand-in", log_dir)
    await worker.wait_ready_async(60)
    targets: dict[str, tuple[list[str], str, dict[str, str] | None]] = {}
    port = free_port()
    python = args.frota_python
    targets["frota"] = (router_bench.router_argv(
        python, "--policy", "round-robin", "--max-inflight", "0", "--workers", worker.url,
        "--log-level", "warning", port=port), "/ready", router_bench.router_env(None, python))
    for src in args.frota_src:
        targets[f"frota@{router_bench.checkout_name(src)}"] = (
            router_bench.router_argv(python, "--policy", "round-robin", "--max-inflight", "0",
                                     "--workers", worker.url, "--log-level", "warning",
                                     port=free_port()),
            "/ready", router_bench.router_env(src, python))
    vllm_router = router_bench.find_vllm_router(args.vllm_router)
    if vllm_router:
        targets["vllm-router"] = (
            [vllm_router, "--host", "127.0.0.1", "--port", str(free_port()),
             "--policy", "round_robin", "--worker-urls", worker.url], "/health", None)
    out: dict[str, Any] = {
        "mode": "instructions", "counter": "callgrind, user space of the router's process",
        "frota": router_bench.checkout_name(str(BENCH.parent)),
        "frota_python": router_bench.interpreter(python),
        "requests": args.requests, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "stand_in_itl_ms": args.stand_in_itl * 1e3,
        "request_headers": [name for name, _ in args.headers],
        "kinstr_per_request": {}}
    try:
        for name, (argv, ready, env) in targets.items():
            out["kinstr_per_request"][name] = {
                mode: await count(name, argv, ready, args, mode == "streaming", log_dir, env)
                for mode in ("non_streaming", "streaming")}
    finally:
        worker.stop()
    counts = out["kinstr_per_request"]
    if "vllm-router" in counts:
        out["frota_over_vllm_router"] = {
            mode: round(counts["frota"][mode] / counts["vllm-router"][mode], 3)
            for mode in ("non_streaming", "streaming")}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model-name", default="smollm2")
    parser.add_argument("--headers", choices=("openai", "bare"), default="openai",
                        help="the headers of each request: the official openai client's "
                             "(17 in all), or Host, Content-Type and Content-Length alone")
    parser.add_argument("--vllm-router", default=None, help="path of the vllm-router binary")
    parser.add_argument("--frota-python", default=None,
                        help="the interpreter that runs Frota's routers (default: this "
                             "one); `bash scripts/image-python.sh` prints the image's")
    parser.add_argument("--frota-src", action="append", default=[],
                        help="another checkout of Frota to count too (repeatable)")
    args = parser.parse_args()
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("valgrind is not installed (apt install valgrind)", file=sys.stderr)
        return 2
    args.stand_in_ttft, args.stand_in_itl = 0.005, 0.002
    args.stand_in_cache_blocks, args.stand_in_prefill_us_per_char = 0, 0.0
    with tempfile.TemporaryDirectory(prefix="router-instructions-") as log_dir:
        print(json.dumps(asyncio.run(run(args, Path(log_dir))), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
