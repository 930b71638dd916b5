"""Structured outputs: xgrammar vs llguidance on SmolLM2's vocabulary, then Frota's engine decoding
the same requests with and without a JSON-schema constraint. Prints one JSON object per row.

    python bench/structured.py [--quick] [--plot] [--only library,engine]

`library` rows (one per library): tokenizer set-up time, grammar compile time for a few
typical JSON schemas (cold: no compile cache), and per-step mask time (fill the token bitmask
of 49152 tokens for each token of a valid instance, walked token by token; mean/p50/p99).
`engine` rows: `--requests` chat requests (SmolLM2, float32, greedy), free (ignore_eos, exactly
as many tokens as its constrained twin) and with a JSON-schema constraint (finishing by
grammar), interleaved,
best of the rounds; decode tokens/s, mean step time, and the time per step spent on the
grammar (masks: frota.engine.grammar.mask_constrained; advancing: Matcher.accept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    }, "required": ["name", "age", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {
        "city": {"type": "string"}, "country": {"enum": ["FR", "PT", "BR", "DE"]},
        "population": {"type": "number", "minimum": 0},
        "location": {"type": "object", "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180}},
            "required": ["lat", "lon"], "additionalProperties": False},
    }, "required": ["city", "country", "location"], "additionalProperties": False},
    {"type": "object", "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {
            "type": "object", "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                "kind": {"anyOf": [{"const": "book"}, {"const": "toy"}, {"type": "null"}]}},
            "required": ["sku", "qty"], "additionalProperties": False}},
        "total": {"type": "number"}, "paid": {"type": "boolean"},
    }, "required": ["items", "total", "paid"], "additionalProperties": False},
]
INSTANCES = [
    '{"name": "Ana Souza", "age": 31, "email": "ana@frota.com", "tags": ["ops", "k8s"]}',
    '{"city": "Lisboa", "country": "PT", "population": 545000, '
    '"location": {"lat": 38.72, "lon": -9.14}}',
    '{"items": [{"sku": "ABC-1234", "qty": 2, "kind": "book"}, {"sku": "XYZ-0001", "qty": 1}], '
    '"total": 31.5, "paid": true}',
]


def stats_ms(values: list[float]) -> dict:
    values = sorted(values)
    return {"mean": round(1e3 * statistics.fmean(values), 4),
            "p50": round(1e3 * values[len(values) // 2], 4),
            "p99": round(1e3 * values[min(len(values) - 1, int(0.99 * len(values)))], 4)}


def bench_xgrammar(tokenizer, repeats: int) -> dict:
    import torch
    import xgrammar as xgr

    from frota.engine.grammar import Constraint, Grammars

    t0 = time.perf_counter()
    grammars = Grammars(tokenizer, max_threads=1)
    setup_s = time.perf_counter() - t0
    compile_s, step_s = [], []
    for _ in range(repeats):
        grammars._cache.clear()
        for schema in SCHEMAS:
            t0 = time.perf_counter()
            grammars.compile(Constraint.json_schema(schema))
            compile_s.append(time.perf_counter() - t0)
    bitmask = xgr.allocate_token_bitmask(1, grammars.vocab_size)
    for schema, text in zip(SCHEMAS, INSTANCES, strict=True):
        matcher = grammars.matcher(Constraint.json_schema(schema))
        for token in [*tokenizer.encode(text), tokenizer.eos_token_ids[0]]:
            t0 = time.perf_counter()
            matcher.fill(bitmask, 0)
            step_s.append(time.perf_counter() - t0)
            allowed = bool((bitmask[0, token // 32] >> (token % 32)) & 1)
            assert allowed, f"xgrammar refused token {token} of {text!r}"
            matcher.accept(token)
        assert matcher.is_terminated and not matcher.is_failed
    logits = torch.randn(1, grammars.vocab_size)
    t0 = time.perf_counter()
    for _ in range(100):
        xgr.apply_token_bitmask_inplace(logits, bitmask)
    apply_ms = (time.perf_counter() - t0) * 10
    return {"row": "library", "library": "xgrammar", "setup_s": round(setup_s, 3),
            "compile_ms": stats_ms(compile_s), "mask_fill_ms": stats_ms(step_s),
            "mask_apply_ms": round(apply_ms, 4), "steps": len(step_s)}


def bench_llguidance(tokenizer, repeats: int) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    lltok = llguidance.hf.from_tokenizer(hf, n_vocab=tokenizer.vocab_size,
                                         eos_token=tokenizer.eos_token_ids[0])
    setup_s = time.perf_counter() - t0
    defaults = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    bitmask = llguidance.torch.allocate_token_bitmask(1, tokenizer.vocab_size)
    compile_s, step_s = [], []
    for _ in range(repeats):
        for schema in SCHEMAS:
            t0 = time.perf_counter()  # llguidance compiles lazily: count the first mask too
            grm = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults)
            matcher = llguidance.LLMatcher(lltok, grm)
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            compile_s.append(time.perf_counter() - t0)
            assert not matcher.is_error(), matcher.get_error()
    for schema, text in zip(SCHEMAS, INSTANCES, strict=True):
        grm = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults)
        matcher = llguidance.LLMatcher(lltok, grm)
        for token in [*tokenizer.encode(text), tokenizer.eos_token_ids[0]]:
            t0 = time.perf_counter()
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            step_s.append(time.perf_counter() - t0)
            assert matcher.consume_token(token), f"llguidance refused {token}: {matcher.get_error()}"
    return {"row": "library", "library": "llguidance", "setup_s": round(setup_s, 3),
            "compile_ms": stats_ms(compile_s), "mask_fill_ms": stats_ms(step_s),
            "steps": len(step_s)}


def run_batch(engine, prompts: list, label: str, params: list, grammar_time: list[float],  # type: ignore[no-untyped-def]
              lengths: list[int]) -> dict:
    """Submit every prompt at once and step to the end; `lengths` gets each one's tokens."""
    grammar_time[0] = 0.0
    steps = generated = 0
    first_at = None
    t0 = time.perf_counter()
    ids = [f"{label}-{i}-{t0}" for i in range(len(prompts))]
    per_request = dict.fromkeys(ids, 0)
    for request_id, p, sp in zip(ids, prompts, params, strict=True):
        engine.add_request(request_id, p, sp)
    while engine.has_unfinished:
        outs = engine.step()
        steps += 1
        for o in outs:
            per_request[o.request_id] += len(o.new_token_ids)
            generated += len(o.new_token_ids)
        if first_at is None and outs:
            first_at = time.perf_counter()
    wall = time.perf_counter() - t0
    decode = wall - (first_at - t0)
    lengths.extend(per_request[i] for i in ids)
    return {"row": "engine", "requests": label, "num_requests": len(prompts),
            "generated_tokens": generated, "steps": steps,
            "decode_tok_per_s": round((generated - len(prompts)) / decode, 1),
            "mean_step_ms": round(1e3 * wall / steps, 3),
            "grammar_ms_per_step": round(1e3 * grammar_time[0] / steps, 3)}


def bench_engine(num_requests: int, max_tokens: int, rounds: int) -> list[dict]:
    from frota.engine import LLM, Constraint, SamplingParams, grammar

    llm = LLM("smollm2", max_model_len=1024, kv_cache_memory=256 << 20, dtype="float32",
              max_num_seqs=num_requests, verbose=False)
    prompts = [llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Give one example record as JSON ({i})."}])
        for i in range(num_requests)]
    mask_time = [0.0]
    original = grammar.mask_constrained

    def timed(logits, seqs) -> None:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        original(logits, seqs)
        mask_time[0] += time.perf_counter() - t0

    grammar.mask_constrained = timed
    accept = grammar.Matcher.accept

    def timed_accept(self, token_id: int) -> None:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        accept(self, token_id)
        mask_time[0] += time.perf_counter() - t0

    grammar.Matcher.accept = timed_accept
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0))  # warm up
    best: dict[str, dict] = {}
    constraint = Constraint.json_schema(SCHEMAS[0])
    for _ in range(rounds):  # interleaved, best of the rounds: the machine may be shared
        lengths: list[int] = []
        row = run_batch(llm.engine, prompts, "json_schema", [SamplingParams(
            max_tokens=max_tokens, temperature=0, constraint=constraint)] * len(prompts),
            mask_time, lengths)
        # The free requests generate exactly as many tokens as their constrained twins did.
        free = run_batch(llm.engine, prompts, "free", [SamplingParams(
            max_tokens=n, temperature=0, ignore_eos=True) for n in lengths], mask_time, [])
        for r in (row, free):
            if r["requests"] not in best or r["decode_tok_per_s"] > best[r["requests"]]["decode_tok_per_s"]:
                best[r["requests"]] = r
    rows = [best["free"], best["json_schema"]]
    grammar.mask_constrained = original
    grammar.Matcher.accept = accept
    free, constrained = rows
    constrained["throughput_loss_pct"] = round(
        100 * (1 - constrained["decode_tok_per_s"] / free["decode_tok_per_s"]), 1)
    constrained["grammar_share_of_step_pct"] = round(
        100 * constrained["grammar_ms_per_step"] / constrained["mean_step_ms"], 1)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    libs = [r for r in rows if r["row"] == "library"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    names = [r["library"] for r in libs]
    axes[0].bar(names, [r["compile_ms"]["mean"] for r in libs])
    axes[0].set_ylabel("JSON schema compile (ms)")
    axes[1].bar(names, [r["mask_fill_ms"]["mean"] for r in libs])
    axes[1].set_ylabel("mask per step, 49152 tokens (ms)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="library,engine")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and requests")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--plot", action="store_true", help="draw bench/out/structured.png")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.server.harness import load_tokenizer

    only = set(args.only.split(","))
    repeats = 2 if args.quick else 5
    rows: list[dict] = []
    if "library" in only:
        tokenizer = load_tokenizer("smollm2")
        rows += [bench_xgrammar(tokenizer, repeats), bench_llguidance(tokenizer, repeats)]
    if "engine" in only:
        rows += bench_engine(4 if args.quick else args.requests, args.max_tokens, repeats - 1)
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.plot and any(r["row"] == "library" for r in rows):
        plot(rows, Path(__file__).parent / "out" / "structured.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
