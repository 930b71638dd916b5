"""The same fleet and the same client load, served by Frota's engine and by vLLM, in one run.

    python bench/runtimes.py                       # both runtimes, the default load
    FROTA_VLLM=~/.cache/frota-vllm/0.32.0/bin/vllm python bench/runtimes.py --plot runtimes.png

Each runtime gets `frota up` of one manifest (SmolLM2 in float32 on CPU, one replica behind
Frota's router) with only `runtime.engine` changed. Each fleet gets the same seeded requests
of `bench/serve.py` (streamed `/v1/completions`, `ignore_eos`), first a short warm-up. Prints
one JSON object: TTFT and inter-token latency p50/p99 and output throughput per runtime.
The two fleets run one after the other, never together, so they do not share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import load_tokenizer, make_requests, run_load, summarize

MANIFEST = {
    "apiVersion": "frota.dev/v1alpha1", "kind": "InferenceService",
    "metadata": {"name": "runtimes-bench"},
    "spec": {
        "model": {"name": "smollm2", "uri": "alias:smollm2"},
        "engine": {"dtype": "float32", "maxModelLen": 2048, "kvCache": {"blockSize": 32},
                   "scheduler": {"maxNumSeqs": 16}},
        "resources": {"cpu": "2", "memory": "6Gi"},
        "replicas": 1,
        "router": {"policy": "least-load"},
    },
}
# vLLM compiles its graphs at start-up unless told not to; -O0 runs eager kernels.
VLLM_ARGS = {"O0": ["--optimization-level", "0"], "default": []}


def fleet_manifest(runtime: str, vllm_mode: str) -> dict:
    manifest = json.loads(json.dumps(MANIFEST))
    manifest["spec"]["runtime"] = {"engine": runtime}
    if runtime == "vllm":
        manifest["spec"]["runtime"]["args"] = VLLM_ARGS[vllm_mode]
    return manifest


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"frota up exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready in {timeout} s")


def serve_one(runtime: str, args: argparse.Namespace, requests, warmup, workdir: Path) -> dict:
    path = workdir / f"{runtime}.yaml"
    path.write_text(yaml.safe_dump(fleet_manifest(runtime, args.vllm_mode)))
    port = args.port
    log = open(workdir / f"{runtime}.log", "w")  # noqa: SIM115 (lives as long as the fleet)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "frota.cli.main", "up", str(path), "--quiet",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, args.ready_timeout)
        ready_s = time.monotonic() - started
        asyncio.run(run_load(url, "smollm2", warmup, concurrency=2))
        results, wall = asyncio.run(run_load(url, "smollm2", requests, concurrency=args.concurrency))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        log.close()
    return {"ready_s": round(ready_s, 1), **summarize(results, wall)}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runtimes = list(result["runtimes"])
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    panels = (("TTFT (s)", "ttft_p50_s", "ttft_p99_s"), ("inter-token latency (s)", "itl_p50_s",
                                                        "itl_p99_s"))
    for ax, (title, p50, p99) in zip(axes, panels, strict=False):
        xs = range(len(runtimes))
        ax.bar([x - 0.2 for x in xs], [result["runtimes"][r][p50] or 0 for r in runtimes], 0.4,
               label="p50")
        ax.bar([x + 0.2 for x in xs], [result["runtimes"][r][p99] or 0 for r in runtimes], 0.4,
               label="p99")
        ax.set_xticks(list(xs), runtimes)
        ax.set_title(title)
        ax.legend()
    axes[2].bar(runtimes, [result["runtimes"][r]["throughput_tok_per_s"] for r in runtimes])
    axes[2].set_title("output tokens/s")
    load = result["load"]
    fig.suptitle(f"SmolLM2 float32 on CPU behind Frota's router: {load['num_requests']} requests, "
                 f"concurrency {load['concurrency']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default="frota,vllm")
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256))
    parser.add_argument("--output-len", type=int, nargs=2, default=(16, 96))
    parser.add_argument("--vllm-mode", choices=list(VLLM_ARGS), default="O0",
                        help="O0: vLLM's eager kernels (fast start); default: vLLM's compiled graphs")
    parser.add_argument("--port", type=int, default=18400)
    parser.add_argument("--ready-timeout", type=float, default=1200)
    parser.add_argument("--plot", help="also draw the comparison into this PNG")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer("smollm2")
    requests = make_requests(tokenizer, args.num_requests, seed=0, prompt_len=tuple(args.prompt_len),
                             output_len=tuple(args.output_len))
    warmup = make_requests(tokenizer, 2, seed=1, prompt_len=(16, 32), output_len=(4, 8))
    result = {"load": {"num_requests": args.num_requests, "concurrency": args.concurrency,
                       "prompt_len": list(args.prompt_len), "output_len": list(args.output_len),
                       "vllm_mode": args.vllm_mode, "cpus": os.cpu_count()},
              "runtimes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for runtime in args.runtimes.split(","):
            result["runtimes"][runtime] = serve_one(runtime, args, requests, warmup, Path(tmp))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
