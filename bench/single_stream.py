"""Single-stream decode: Frota's engine vs llama.cpp on the same GGUF, one request at a time.

    python bench/single_stream.py [--rounds 3] [--prompt-len 256] [--tokens 128]

Frota runs the GGUF's own Q4_1 blocks through its int4 kernels (bfloat16 activations), with
its fused decode stack and, to show what that buys, through the Python layers; and in
bfloat16 for reference; llama.cpp (`llama-cpp-python`, built from source with this
machine's compiler in its own environment, `scripts/llama-env.sh`, or `$FROTA_LLAMA_CPP`'s
python) runs the same file, through `bench/llama_cpp_decode.py`. Both use every core.
Each round has its own prompt, cut from the benchmark text; the engines alternate round
by round, both loaded, and the median round of each is reported. Decode tokens per second
count the forward passes after the prompt's (greedy, one token each); prefill tokens per
second the prompt's tokens over its forward pass. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine_throughput import REPO, TEXT, make_requests

GREEDY_PREFIX = 16


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many greedy tokens two runs start with in common (at most GREEDY_PREFIX)."""
    n = min(len(a), len(b), GREEDY_PREFIX)
    return next((j for j in range(n) if a[j] != b[j]), n)


def llama_python() -> str:
    return os.environ.get("FROTA_LLAMA_CPP") or subprocess.run(
        ["bash", str(REPO / "scripts" / "llama-env.sh")], check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1]


def frota_round(engine, prompt: list[int], tokens: int, tag: str) -> dict:
    """Prefill (the first step: the prompt plus the first token), then `tokens` decode steps."""
    from frota.engine import SamplingParams

    engine.add_request(tag, prompt, SamplingParams(max_tokens=tokens + 1, temperature=0,
                                                   ignore_eos=True))
    t0 = time.perf_counter()
    ids = [t for out in engine.step() for t in out.new_token_ids]
    t1 = time.perf_counter()
    while engine.has_unfinished:
        ids += [t for out in engine.step() for t in out.new_token_ids]
    t2 = time.perf_counter()
    return {"prefill_tok_per_s": len(prompt) / (t1 - t0), "decode_tok_per_s": tokens / (t2 - t1),
            "greedy_ids": ids[:GREEDY_PREFIX]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a GGUF alias or path")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128, help="decode steps per round")
    args = parser.parse_args()
    import torch

    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine
    from frota.engine.loader import resolve_model

    gguf = resolve_model(args.model).path
    threads = torch.get_num_threads()
    engines = {name: LLMEngine(EngineArgs(model=args.model, dtype="bfloat16", quantization=quant,
                                          max_num_seqs=1, max_model_len=2048, verbose=False))
               for name, quant in (("frota_int4", "int4"), ("frota_int4_python_layers", "int4"),
                                   ("frota_bf16", "none"))}
    # The same int4 weights through the Python layers, not the fused decode stack: what it buys.
    engines["frota_int4_python_layers"].runner.model.fused_decode = False
    tokenizer = engines["frota_int4"].tokenizer
    prompts = [p for p, _ in make_requests(tokenizer, args.rounds + 1,
                                           (args.prompt_len, args.prompt_len), (1, 1), seed=7,
                                           text=TEXT)]
    spec = tempfile.NamedTemporaryFile("w", suffix=".json")  # noqa: SIM115

    class Llama:
        """llama.cpp in its own process; `run(i)` decodes prompt i there."""

        def __init__(self, extra_bufts: bool) -> None:
            spec.seek(0)
            spec.truncate()
            json.dump({"gguf": gguf, "threads": threads, "prompts": prompts, "tokens": args.tokens,
                       "extra_bufts": extra_bufts}, spec)
            spec.flush()
            self.extra_bufts = extra_bufts
            self.proc = subprocess.Popen(
                [llama_python(), str(REPO / "bench" / "llama_cpp_decode.py"), spec.name],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._read()  # READY

        def _read(self) -> str:
            for line in self.proc.stdout:
                if line.startswith(("READY", "RESULT ")):
                    return line.removeprefix("RESULT ").strip()
            raise RuntimeError(f"llama.cpp exited with {self.proc.wait()}")

        def run(self, i: int) -> dict:
            self.proc.stdin.write(f"{i}\n")
            self.proc.stdin.flush()
            return json.loads(self._read())

        def close(self) -> None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    # ggml's AMX matmul crashes on some CPUs and VMs (a segfault in llama_decode): then it
    # runs without its extra buffer types, and the JSON says so.
    try:
        llama = Llama(extra_bufts=True)
        llama.run(len(prompts) - 1)  # its warm-up
    except RuntimeError:
        llama = Llama(extra_bufts=False)
        llama.run(len(prompts) - 1)
    llama_round = llama.run
    runs: dict[str, list[dict]] = {name: [] for name in (*engines, "llama_cpp")}
    for name, engine in engines.items():  # warm-up: first-call costs stay out
        frota_round(engine, prompts[-1][:32], 4, f"warm-{name}")
    for i in range(args.rounds):
        for name, engine in engines.items():
            runs[name].append(frota_round(engine, prompts[i], args.tokens, f"{name}-{i}"))
        runs["llama_cpp"].append(llama_round(i))
        print(json.dumps({"round": i + 1, **{n: round(r[-1]["decode_tok_per_s"], 1)
                                             for n, r in runs.items()}}), file=sys.stderr, flush=True)
    llama.close()
    spec.close()

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[name]), 1)

    result = {"model": Path(gguf).name, "threads": threads, "prompt_len": args.prompt_len,
              "decode_tokens": args.tokens, "rounds": args.rounds,
              "llama_cpp_extra_bufts": llama.extra_bufts}
    for name in runs:
        result[f"{name}_decode_tok_per_s"] = median(name, "decode_tok_per_s")
        result[f"{name}_prefill_tok_per_s"] = median(name, "prefill_tok_per_s")
    result["int4_decode_vs_llama_cpp"] = round(
        result["frota_int4_decode_tok_per_s"] / result["llama_cpp_decode_tok_per_s"], 2)
    result["fused_decode_stack_speedup"] = round(
        result["frota_int4_decode_tok_per_s"] / result["frota_int4_python_layers_decode_tok_per_s"], 2)
    # Both run the file's Q4_1 weights, with different activation arithmetic (Frota bfloat16,
    # llama.cpp 8-bit blocks): how many greedy tokens each round starts with in common.
    result["int4_greedy_common_prefix"] = [
        common_prefix(a["greedy_ids"], b["greedy_ids"])
        for a, b in zip(runs["frota_int4"], runs["llama_cpp"], strict=True)]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
