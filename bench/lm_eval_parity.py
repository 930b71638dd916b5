"""lm-evaluation-harness accuracy through Frota's OpenAI API, beside transformers on the same weights.

    python bench/lm_eval_parity.py                          # spawns a SmolLM2 worker
    python bench/lm_eval_parity.py --target http://HOST:PORT --served-model-name smollm2

The task is tests/fixtures/lm_eval/tiny_mc.yaml (20 multiple-choice questions from a local
jsonl, no download). lm-eval's `local-completions` model scores each choice through
`/v1/completions` with `echo` + `logprobs` (prompt logprobs); its `hf` model scores the same
token ids with transformers, on the HF-layout copy `frota convert` writes of the served GGUF.
Prints one JSON object: both accuracies and the largest per-choice loglikelihood difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# The process helpers (spawned worker) and the task live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKER_ARGS = ("--max-model-len", "2048", "--max-num-seqs", "8", "--kv-cache-memory", "512MiB",
               "--dtype", "float32")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="a running worker or router; default: spawn a worker")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--hf-dir", type=Path, default=None,
                        help="where to write (or find) the HF-layout copy; default: a temp dir")
    args = parser.parse_args()

    from tests.server.harness import WorkerProcess
    from tests.server.lm_eval_parity import export_model, parity

    t0 = time.monotonic()
    worker = None
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = export_model(args.hf_dir or Path(tmp) / "hf", args.model)
        target = args.target
        if target is None:
            log_path = Path("bench/out/lm_eval_worker.log")
            log_path.parent.mkdir(parents=True, exist_ok=True)
            worker = WorkerProcess(args.model, *WORKER_ARGS, log_path=log_path)
            worker.wait_ready(timeout_s=600)
            target = worker.url
        try:
            report = parity(target, hf_dir)
        finally:
            if worker is not None:
                worker.stop()
    report["model"] = args.model
    report["target"] = args.target or f"spawned frota worker {' '.join(WORKER_ARGS)}"
    report["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
