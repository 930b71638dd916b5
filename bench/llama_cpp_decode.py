"""llama.cpp on a GGUF, one request at a time: the peer of `engine_throughput.py --single-stream`.

Runs in llama.cpp's own environment (`scripts/llama-env.sh`), never imports Frota:

    ~/.cache/frota-llama/0.3.36/bin/python bench/llama_cpp_decode.py SPEC.json

SPEC.json: {"gguf": path, "threads", "prompts": [[token ids], ...], "tokens": decode steps,
"extra_bufts": bool}. `extra_bufts` false loads the weights without llama.cpp's extra buffer
types (its AMX and repacked layouts), for CPUs where those crash.
It loads the model, prints `READY`, then for each line read from stdin (a prompt's index)
evaluates that prompt in one batch (prefill), then decodes `tokens` greedy tokens one
`llama_decode` at a time, and prints `RESULT ` and JSON: prefill and decode seconds and
tokens per second, and the greedy ids. Its logs go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    if not spec.get("extra_bufts", True):
        defaults = llama_cpp.llama_model_default_params

        def without_extra_bufts():  # what Llama() starts its model parameters from
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_cpp.llama_model_default_params = without_extra_bufts

    llm = Llama(model_path=spec["gguf"], n_ctx=2048, n_batch=512, n_threads=spec["threads"],
                n_threads_batch=spec["threads"], verbose=False)
    vocab = llm.n_vocab()
    print("READY", file=protocol, flush=True)
    for line in sys.stdin:
        prompt = spec["prompts"][int(line)]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        ids = []
        for _ in range(spec["tokens"]):
            # The last evaluated token's logits (Llama.scores is filled only with logits_all).
            token = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
            ids.append(token)
            llm.eval([token])
        t2 = time.perf_counter()
        print("RESULT " + json.dumps({
            "prefill_s": t1 - t0, "prefill_tok_per_s": len(prompt) / (t1 - t0),
            "decode_s": t2 - t1, "decode_tok_per_s": len(ids) / (t2 - t1), "greedy_ids": ids,
        }), file=protocol, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
