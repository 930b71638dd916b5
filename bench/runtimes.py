"""The same fleet and the same client load, served by Frota's engine and by vLLM, in one run.

    python bench/runtimes.py                       # both runtimes, concurrency 1, 8 and 32
    FROTA_VLLM=~/.cache/frota-vllm/0.32.0/bin/vllm python bench/runtimes.py --plot runtimes.png
    python bench/runtimes.py --dtype bfloat16 --concurrency 8

Each runtime gets `frota up` of one manifest (SmolLM2 on CPU, one replica behind Frota's
router) with only `runtime.engine` changed: `frota worker` or vLLM's OpenAI server (`vllm
serve`, its default compiled mode unless `--vllm-mode O0`). At each concurrency, each fleet
gets the same seeded requests of `bench/serve.py` (streamed `/v1/completions`,
`ignore_eos`; by default 3 per client, at least 8), after a short warm-up. Prints one JSON
object: TTFT and inter-token latency p50/p99 and output throughput per runtime and
concurrency, and Frota's ratios to vLLM. The two fleets run one after the other, never
together, so they do not share the cores.
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
                   "scheduler": {"maxNumSeqs": 32}},
        "resources": {"cpu": "2", "memory": "6Gi"},
        "replicas": 1,
        "router": {"policy": "least-load"},
    },
}
# vLLM compiles its graphs at start-up unless told not to; -O0 runs eager kernels.
VLLM_ARGS = {"O0": ["--optimization-level", "0"], "default": []}


def fleet_manifest(runtime: str, vllm_mode: str, dtype: str = "float32") -> dict:
    manifest = json.loads(json.dumps(MANIFEST))
    manifest["spec"]["engine"]["dtype"] = dtype
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


def serve_one(runtime: str, args: argparse.Namespace, loads: dict[int, list], warmup,
              workdir: Path) -> dict:
    """One fleet of `runtime`, started once, then each concurrency's load in turn."""
    path = workdir / f"{runtime}.yaml"
    path.write_text(yaml.safe_dump(fleet_manifest(runtime, args.vllm_mode, args.dtype)))
    port = args.port
    log = open(workdir / f"{runtime}.log", "w")  # noqa: SIM115 (lives as long as the fleet)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "frota.cli.main", "up", str(path), "--quiet",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    out: dict = {}
    try:
        wait_ready(url, proc, args.ready_timeout)
        out["ready_s"] = round(time.monotonic() - started, 1)
        asyncio.run(run_load(url, "smollm2", warmup, concurrency=2))
        for concurrency, requests in loads.items():
            results, wall = asyncio.run(run_load(url, "smollm2", requests, concurrency=concurrency))
            out[str(concurrency)] = summarize(results, wall)
            print(json.dumps({"runtime": runtime, "concurrency": concurrency, **out[str(concurrency)]}),
                  file=sys.stderr, flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        log.close()
    return out


def ratios(result: dict) -> dict:
    """Frota over vLLM per concurrency: throughput (higher is better), TTFT and ITL p50
    (lower is better)."""
    frota, vllm = result["runtimes"].get("frota"), result["runtimes"].get("vllm")
    if not frota or not vllm:
        return {}
    out = {}
    for level in result["load"]["concurrency"]:
        f, v = frota[str(level)], vllm[str(level)]
        out[str(level)] = {
            "throughput": round(f["throughput_tok_per_s"] / v["throughput_tok_per_s"], 2),
            "ttft_p50": round(f["ttft_p50_s"] / v["ttft_p50_s"], 2),
            "itl_p50": round(f["itl_p50_s"] / v["itl_p50_s"], 2),
        }
    return out


def plot(result: dict, path: str) -> None:
    """TTFT p50, ITL p50 and throughput against concurrency, one line per runtime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result["load"]["concurrency"]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    panels = (("TTFT p50 (s)", "ttft_p50_s"), ("inter-token latency p50 (s)", "itl_p50_s"),
              ("output tokens/s", "throughput_tok_per_s"))
    for ax, (title, key) in zip(axes, panels, strict=True):
        for runtime, data in result["runtimes"].items():
            ax.plot(levels, [data[str(c)][key] for c in levels], marker="o", label=runtime)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"SmolLM2 {result['load']['dtype']} on CPU behind Frota's router, "
                 "streamed completions", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default="frota,vllm")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256))
    parser.add_argument("--output-len", type=int, nargs=2, default=(16, 96))
    parser.add_argument("--vllm-mode", choices=list(VLLM_ARGS), default="default",
                        help="default: vLLM's compiled graphs; O0: its eager kernels (fast start)")
    parser.add_argument("--port", type=int, default=18400)
    parser.add_argument("--ready-timeout", type=float, default=1200)
    parser.add_argument("--plot", help="also draw the comparison into this PNG")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer("smollm2")
    levels = [int(c) for c in args.concurrency.split(",")]
    loads = {c: make_requests(tokenizer, max(8, args.requests_per_client * c), seed=c,
                              prompt_len=tuple(args.prompt_len), output_len=tuple(args.output_len))
             for c in levels}
    warmup = make_requests(tokenizer, 2, seed=1000, prompt_len=(16, 32), output_len=(4, 8))
    result = {"load": {"concurrency": levels, "num_requests": {str(c): len(r) for c, r in loads.items()},
                       "prompt_len": list(args.prompt_len), "output_len": list(args.output_len),
                       "dtype": args.dtype, "vllm_mode": args.vllm_mode, "cpus": os.cpu_count()},
              "runtimes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for runtime in args.runtimes.split(","):
            result["runtimes"][runtime] = serve_one(runtime, args, loads, warmup, Path(tmp))
    result["frota_over_vllm"] = ratios(result)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
