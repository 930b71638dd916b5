"""Quality, memory and speed of SmolLM2 under each weight / KV-cache format, in one run.

    python bench/quantization.py                 # one JSON row per configuration
    python bench/quantization.py --plot          # also bench/out/quantization.png
    python bench/quantization.py --profile int4  # where a decode step's time goes
    python bench/quantization.py --rows bfloat16,int4 --only decode   # just batch-1 decode
    python bench/quantization.py --kernels       # per-shape matmul times, each kernel

Rows: float32, bfloat16, int8 (per-channel weights, bf16 activations), int4
(the GGUF's own Q4_1 blocks kept as int4 group 32, bf16 activations), int8-kv
(bfloat16 weights, int8 KV cache). Each row:

- `ppl`: perplexity of the GPL-3 text (at least 4k tokens, windows of 1024),
  `ppl_delta_pct` against bfloat16;
- `weight_mb`: bytes of every weight the model holds, each tensor once (MB = 1e6);
- `kv_bytes_per_token`: K and V of one token across layers (frota.api.memory);
- `decode_tok_per_s_batch1`: one request, tokens after the first / their time
  (best of `--repeats`: the machine may be shared);
- `throughput_tok_per_s`: generated tokens / wall time on the engine benchmark's
  workload (`bench/engine_throughput.py`: GPL-3 windows as prompts, all submitted
  at once, `ignore_eos`); by default its `--quick` size (16 requests, prompts of
  32-512 tokens, outputs of 16-64), `--full-workload` for its 64 requests.

`--only decode` (or `ppl`, `throughput`, comma-separated) measures just those columns;
`--interleave N` then runs the rows' decode N times in turn in one process, so every
row sees the same machine load (best of the rounds per row). `--kernels` times each
linear shape of SmolLM2 at a few batch sizes for every kernel (bf16 `F.linear`,
torch's int8/int4 ops, Frota's CPU kernels, dequantize-then-bf16), over 30 copies of
each weight so that, as in the model, weights come from memory rather than cache,
and adds up one decode step's matmuls per format.

Rows print as they finish, bfloat16 first (the baseline of the `*_vs_bf16`
fields). `--threads` defaults to 1: on a shared machine, spinning OpenMP threads
make small ops many times slower.
"""

from __future__ import annotations

import argparse
import functools
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
    t0 = time.perf_counter()
    engine = make_engine(row)
    load_s = time.perf_counter() - t0
    log(f"{row.name}: loaded in {load_s:.0f}s")
    result = measure_engine(engine, row, text, args)
    result["load_s"] = round(load_s, 1)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    del engine
    return result


def measure_engine(engine, row: Row, text: str, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    import torch
    from engine_throughput import make_requests

    from frota.api.memory import kv_bytes_per_token
    from frota.engine.eval import perplexity

    t0 = time.perf_counter()
    only = set(args.only.split(","))
    cfg = engine.model_config
    ids = engine.tokenizer.encode(text)
    result: dict = {
        "name": row.name,
        "dtype": row.dtype,
        "quantization": row.quantization,
        "kv_cache_dtype": row.kv_cache_dtype,
        "weight_mb": round(weight_bytes(engine.runner.model) / 1e6, 1),
        "kv_bytes_per_token": kv_bytes_per_token(
            cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, row.kv_cache_dtype,
            str(engine.dtype).removeprefix("torch.")),
        "threads": torch.get_num_threads(),
    }
    if "ppl" in only:
        # A quantized KV cache only matters where attention reads it: its perplexity windows
        # are prefilled in chunks of 256 tokens, so all but the first chunk read their context
        # from the cache (a whole-window prefill attends to the fresh, unquantized K/V).
        full_chunk = engine.scheduler.max_num_batched_tokens
        if row.kv_cache_dtype != "auto":
            engine.scheduler.max_num_batched_tokens = 256
        ppl, count = perplexity(engine, text, 1024, args.ppl_tokens)
        engine.scheduler.max_num_batched_tokens = full_chunk
        log(f"{row.name}: ppl {ppl:.4f} over {count} tokens ({time.perf_counter() - t0:.0f}s)")
        result["ppl"] = round(ppl, 4)
        result["ppl_tokens"] = count
    if "decode" in only:
        decode = decode_speed(engine, ids[:32], args.decode_tokens, args.repeats)
        log(f"{row.name}: batch-1 decode {decode:.1f} tok/s ({time.perf_counter() - t0:.0f}s)")
        result["decode_tok_per_s_batch1"] = round(decode, 2)
    if "throughput" in only:
        n, out_range = (64, (16, 256)) if args.full_workload else (16, (16, 64))
        tput = throughput(engine, make_requests(engine.tokenizer, n, (32, 512), out_range))
        result["throughput_tok_per_s"] = round(tput, 2)
    return result


def interleaved_decode(rows: list[Row], text: str, args: argparse.Namespace) -> list[dict]:
    """Batch-1 decode of every row, `--interleave` rounds in turn in one process: each
    row's best round, all taken under the same machine load."""
    engines = [make_engine(r) for r in rows]
    ids = engines[0].tokenizer.encode(text)[:32]
    best = [0.0] * len(rows)
    for round_ in range(args.interleave):
        for i, engine in enumerate(engines):
            speed = decode_speed(engine, ids, args.decode_tokens, 1)
            best[i] = max(best[i], speed)
            log(f"round {round_}: {rows[i].name} {speed:.1f} tok/s")
    out = []
    for r, engine, speed in zip(rows, engines, best, strict=True):
        out.append({"name": r.name, "dtype": r.dtype, "quantization": r.quantization,
                    "kv_cache_dtype": r.kv_cache_dtype,
                    "weight_mb": round(weight_bytes(engine.runner.model) / 1e6, 1),
                    "decode_tok_per_s_batch1": round(speed, 2), "interleaved_rounds": args.interleave})
    return out


# SmolLM2-135M's linears (out, in) and how many of each a decode step runs
SHAPES = {"qkv": (960, 576, 30), "o": (576, 576, 30), "gate_up": (3072, 576, 30),
          "down": (576, 1536, 30), "lm_head": (49152, 576, 1)}


def kernel_times(batches: list[int], copies: int = 30) -> list[dict]:
    """Per shape and batch size: microseconds per call of each kernel, weights cold."""
    import torch
    import torch.nn.functional as F

    from frota.engine.quant import linear
    from frota.engine.quant.formats import quantize_int4, quantize_int8
    from frota.engine.quant.linear import Int4Linear, Int8Linear

    have_frota = linear.frota_kernels(torch.device("cpu")) is not None
    real = linear.frota_kernels

    def timed(calls, x) -> float:  # type: ignore[no-untyped-def]
        for f in calls:
            f(x)
        best = math.inf
        for _ in range(5):
            start = time.perf_counter()
            for f in calls:
                f(x)
            best = min(best, time.perf_counter() - start)
        return best / len(calls) * 1e6

    def layers(make, weights, torch_ops: bool) -> list:  # type: ignore[no-untyped-def]
        linear.frota_kernels = (lambda device: None) if torch_ops else real  # type: ignore[assignment]
        try:
            out = []
            for w in weights:
                layer = make(w)
                layer.prepare(torch.bfloat16)
                out.append(layer)
            return out
        finally:
            linear.frota_kernels = real  # type: ignore[assignment]

    def bf16_packed(weights) -> dict[str, list]:  # type: ignore[no-untyped-def]
        """The engine's bf16 linears: packed once for oneDNN, where this engine has that."""
        try:
            from frota.engine.kernels.linear import PackedLinear, supported
        except ImportError:
            return {}
        if not supported(torch.bfloat16):
            return {}
        return {"bf16_packed": [PackedLinear(torch.nn.Linear(w.shape[1], w.shape[0], bias=False,
                                                              dtype=torch.bfloat16))
                                for w in weights]}

    rows = []
    torch.manual_seed(0)
    for name, (n, k, _) in SHAPES.items():
        count = copies if name != "lm_head" else 2
        weights = [torch.randn(n, k) * 0.02 for _ in range(count)]
        kinds: dict[str, list] = {
            "bf16": [functools.partial(F.linear, weight=w.bfloat16()) for w in weights],
            **bf16_packed(weights),
            "int8_torch": layers(lambda w: Int8Linear(quantize_int8(w)), weights, True),
            "int8g32_torch": layers(lambda w: Int8Linear(quantize_int8(w, 32)), weights, True),
            "int4_torch": layers(lambda w: Int4Linear(quantize_int4(w, 32)), weights, True),
        }
        if have_frota:
            kinds["int8_frota"] = layers(lambda w: Int8Linear(quantize_int8(w)), weights, False)
            kinds["int8g32_frota"] = layers(lambda w: Int8Linear(quantize_int8(w, 32)), weights, False)
            kinds["int4_frota"] = layers(lambda w: Int4Linear(quantize_int4(w, 32)), weights, False)
            for kind in ("int8", "int8g32", "int4"):
                kinds[f"{kind}_dequant_bf16"] = [
                    lambda x, layer=layer: F.linear(x, layer.dequantized_weight(torch.bfloat16))
                    for layer in kinds[f"{kind}_frota"]]
        del weights
        for m in batches:
            x = torch.randn(m, k).bfloat16()
            row = {"shape": name, "out": n, "in": k, "batch": m}
            for kind, calls in kinds.items():
                if kind.endswith("_torch"):
                    linear.frota_kernels = lambda device: None  # type: ignore[assignment]
                try:
                    row[f"{kind}_us"] = round(timed(calls, x), 1)
                finally:
                    linear.frota_kernels = real  # type: ignore[assignment]
            rows.append(row)
            print(json.dumps(row), flush=True)
    for m in batches:  # one decode step's matmuls, per format
        step = {"shape": "decode_step_matmuls", "batch": m}
        for key in rows[0]:
            if key.endswith("_us"):
                step[key.replace("_us", "_ms")] = round(sum(
                    r[key] * SHAPES[r["shape"]][2] for r in rows
                    if r["batch"] == m and key in r) / 1000, 2)
        rows.append(step)
        print(json.dumps(step), flush=True)
    return rows


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
    parser.add_argument("--only", default="ppl,decode,throughput",
                        help="columns to measure: comma-separated subset of ppl, decode, throughput")
    parser.add_argument("--interleave", type=int, default=0, metavar="N",
                        help="with --only decode: N rounds of every row's decode in turn, one process")
    parser.add_argument("--kernels", action="store_true",
                        help="per-shape kernel times instead (see the module docstring)")
    parser.add_argument("--kernel-batches", default="1,4,8,16",
                        help="batch sizes for --kernels")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # engine_throughput's workload
    text = Path(TEXT).read_text(encoding="utf-8")
    by_name = {r.name: r for r in ROWS}
    if args.profile:
        profile(by_name[args.profile], text)
        return 0
    if args.kernels:
        kernel_times([int(b) for b in args.kernel_batches.split(",")])
        return 0
    rows: list[dict] = []
    base: dict | None = None
    if args.interleave:
        if args.only != "decode":
            parser.error("--interleave measures batch-1 decode only: add --only decode")
        results = interleaved_decode([by_name[n] for n in args.rows.split(",")], text, args)
    else:
        results = (measure(by_name[name], text, args) for name in args.rows.split(","))
    for r in results:
        if r["name"] == "bfloat16":
            base = r
        if base:
            if "ppl" in r and "ppl" in base:
                r["ppl_delta_pct"] = round(100 * (r["ppl"] / base["ppl"] - 1), 3)
            r["weight_vs_bf16"] = round(r["weight_mb"] / base["weight_mb"], 3)
            if "decode_tok_per_s_batch1" in r and "decode_tok_per_s_batch1" in base:
                r["decode_vs_bf16"] = round(
                    r["decode_tok_per_s_batch1"] / base["decode_tok_per_s_batch1"], 3)
        print(json.dumps(r), flush=True)
        rows.append(r)
    if args.plot and base and all("ppl" in r and "decode_tok_per_s_batch1" in r for r in rows):
        out = Path(__file__).resolve().parent / "out"
        out.mkdir(exist_ok=True)
        plot(rows, out / "quantization.png")
    return 0 if all(math.isfinite(r.get("ppl", 0.0)) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
