"""Quality, memory and speed of SmolLM2 under each weight / KV-cache format, in one run.

    python bench/quantization.py                 # one JSON row per configuration
    python bench/quantization.py --plot          # also bench/out/quantization.png
    python bench/quantization.py --profile int4  # where a decode step's time goes

Rows: float32, bfloat16, int8 (per-channel weights, bf16 activations), int4
(the GGUF's own Q4_1 blocks kept as int4 group 32, bf16 activations), int8-kv
(bfloat16 weights, int8 KV cache). Each row:

- `ppl`: perplexity of the GPL-3 text (at least 4k tokens, windows of 1024),
  `ppl_delta_pct` against bfloat16;
- `weight_mb`: bytes of every weight the model holds, each tensor once (MB = 1e6);
- `kv_bytes_per_token`: K and V of one token across layers (frota.engine.quant.accounting);
- `decode_tok_per_s_batch1`: one request, tokens after the first / their time
  (best of `--repeats`: the machine may be shared);
- `throughput_tok_per_s`: generated tokens / wall time on the engine benchmark's
  workload (`bench/engine_throughput.py`: GPL-3 windows as prompts, all submitted
  at once, `ignore_eos`); by default its `--quick` size (16 requests, prompts of
  32-512 tokens, outputs of 16-64), `--full-workload` for its 64 requests.

Rows print as they finish, bfloat16 first (the baseline of the `*_vs_bf16`
fields). `--threads` defaults to 1: on a shared machine, spinning OpenMP threads
make small ops many times slower.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TEXT = "/usr/share/common-licenses/GPL-3"


@dataclass(frozen=True)
class Row:
    name: str
    dtype: str
    quantization: str = "none"
    kv_cache_dtype: str = "auto"


ROWS = (
    Row("bfloat16", "bfloat16"),
    Row("float32", "float32"),
    Row("int8", "bfloat16", "int8"),
    Row("int4", "bfloat16", "int4"),
    Row("int8-kv", "bfloat16", "none", "int8"),
)


def weight_bytes(model) -> int:  # type: ignore[no-untyped-def]
    from frota.engine.quant.apply import quantized_weight_bytes

    return quantized_weight_bytes(model)


def make_engine(row: Row, max_num_seqs: int = 32):  # type: ignore[no-untyped-def]
    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine

    args = EngineArgs(model="smollm2", dtype=row.dtype, quantization=row.quantization,
                      kv_cache_dtype=row.kv_cache_dtype, max_num_seqs=max_num_seqs,
                      max_model_len=2048, num_kv_blocks=1024, verbose=False)
    return LLMEngine(args)


def decode_speed(engine, prompt: list[int], tokens: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """Batch-1 decode tokens per second (the first token, from prefill, is not counted)."""
    from frota.engine import SamplingParams

    best = 0.0
    for r in range(repeats):
        engine.add_request(f"decode-{r}", prompt, SamplingParams(max_tokens=tokens,
                                                                 temperature=0.0, ignore_eos=True))
        engine.step()  # prefill + first token
        start, count = time.perf_counter(), 0
        while engine.has_unfinished:
            count += sum(len(o.new_token_ids) for o in engine.step())
        best = max(best, count / (time.perf_counter() - start))
    return best


def throughput(engine, requests: list[tuple[list[int], int]]) -> float:  # type: ignore[no-untyped-def]
    """Generated tokens per second on the engine benchmark's requests."""
    from engine_throughput import run_frota

    run_frota(engine, requests[:2], tag="warm")
    return run_frota(engine, requests)["tok_per_s"]


def log(message: str) -> None:
    print(f"[bench.quantization] {message}", file=sys.stderr, flush=True)


def measure(row: Row, text: str, args: argparse.Namespace) -> dict:
    import torch
    from engine_throughput import make_requests
    from frota.engine.eval import perplexity
    from frota.engine.quant.accounting import kv_bytes_per_token

    t0 = time.perf_counter()
    engine = make_engine(row)
    load_s = time.perf_counter() - t0
    log(f"{row.name}: loaded in {load_s:.0f}s")
    cfg = engine.model_config
    ids = engine.tokenizer.encode(text)
    # A quantized KV cache only matters where attention reads it: its perplexity windows are
    # prefilled in chunks of 256 tokens, so all but the first chunk read their context from
    # the cache (a whole-window prefill attends to the fresh, unquantized K/V).
    full_chunk = engine.scheduler.max_num_batched_tokens
    if row.kv_cache_dtype != "auto":
        engine.scheduler.max_num_batched_tokens = 256
    ppl, count = perplexity(engine, text, 1024, args.ppl_tokens)
    engine.scheduler.max_num_batched_tokens = full_chunk
    log(f"{row.name}: ppl {ppl:.4f} over {count} tokens ({time.perf_counter() - t0:.0f}s)")
    decode = decode_speed(engine, ids[:32], args.decode_tokens, args.repeats)
    log(f"{row.name}: batch-1 decode {decode:.1f} tok/s ({time.perf_counter() - t0:.0f}s)")
    n, out_range = (64, (16, 256)) if args.full_workload else (16, (16, 64))
    tput = throughput(engine, make_requests(engine.tokenizer, n, (32, 512), out_range))
    result = {
        "name": row.name,
        "dtype": row.dtype,
        "quantization": row.quantization,
        "kv_cache_dtype": row.kv_cache_dtype,
        "ppl": round(ppl, 4),
        "ppl_tokens": count,
        "weight_mb": round(weight_bytes(engine.runner.model) / 1e6, 1),
        "kv_bytes_per_token": kv_bytes_per_token(
            cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, row.kv_cache_dtype,
            str(engine.dtype).removeprefix("torch.")),
        "decode_tok_per_s_batch1": round(decode, 2),
        "throughput_tok_per_s": round(tput, 2),
        "load_s": round(load_s, 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "threads": torch.get_num_threads(),
    }
    del engine
    return result


def profile(row: Row, text: str) -> None:
    """Print the ops that take a batch-1 decode step's time."""
    import torch
    from frota.engine import SamplingParams

    engine = make_engine(row)
    ids = engine.tokenizer.encode(text)[:32]
    engine.add_request("p", ids, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    for _ in range(8):
        engine.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(16):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18), file=sys.stderr)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    speeds = [r["decode_tok_per_s_batch1"] for r in rows]
    top = max(speeds) or 1.0
    for r, speed in zip(rows, speeds, strict=True):
        ax.scatter(r["weight_mb"], r["ppl_delta_pct"], s=60 + 600 * speed / top, alpha=0.6)
        ax.annotate(f'{r["name"]}\n{speed:.0f} tok/s', (r["weight_mb"], r["ppl_delta_pct"]),
                    textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("weights (MB)")
    ax.set_ylabel("perplexity change vs bfloat16 (%)")
    ax.set_title("SmolLM2-135M: quality vs memory (marker size: batch-1 decode speed)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(r.name for r in ROWS),
                        help="comma-separated subset of " + ", ".join(r.name for r in ROWS))
    parser.add_argument("--ppl-tokens", type=int, default=4096)
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full-workload", action="store_true",
                        help="the engine benchmark's full 64 requests (default: its --quick 16)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--plot", action="store_true", help="draw bench/out/quantization.png")
    parser.add_argument("--profile", metavar="ROW", help="profile a decode step of ROW instead")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # engine_throughput's workload
    text = Path(TEXT).read_text(encoding="utf-8")
    by_name = {r.name: r for r in ROWS}
    if args.profile:
        profile(by_name[args.profile], text)
        return 0
    rows: list[dict] = []
    base: dict | None = None
    for name in args.rows.split(","):
        r = measure(by_name[name], text, args)
        if name == "bfloat16":
            base = r
        if base:
            r["ppl_delta_pct"] = round(100 * (r["ppl"] / base["ppl"] - 1), 3)
            r["weight_vs_bf16"] = round(r["weight_mb"] / base["weight_mb"], 3)
            r["decode_vs_bf16"] = round(
                r["decode_tok_per_s_batch1"] / base["decode_tok_per_s_batch1"], 3)
        print(json.dumps(r), flush=True)
        rows.append(r)
    if args.plot and base:
        out = Path(__file__).resolve().parent / "out"
        out.mkdir(exist_ok=True)
        plot(rows, out / "quantization.png")
    return 0 if all(math.isfinite(r["ppl"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
