"""lm-evaluation-harness against Frota and against transformers, on a local 20-question task.

Both sides score the same token ids: lm-eval's `local-completions` model sends the prompts
as token ids (tokenized with the HF tokenizer `frota convert` writes) to `/v1/completions`
with `echo` + `logprobs`, and its `hf` model runs transformers on the weights `frota convert`
wrote from the same GGUF the worker serves. Used by tests/server/test_lm_eval.py and
bench/lm_eval_parity.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

# No downloads: the task reads a local jsonl, the models are local files.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TASK_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "lm_eval"
TASK = "frota_tiny_mc"


def task_config() -> dict[str, Any]:
    """The task YAML as a dict, its data file made absolute."""
    config = yaml.safe_load((TASK_DIR / "tiny_mc.yaml").read_text())
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"]["data_files"] = {k: str(TASK_DIR / v) for k, v in files.items()}
    return config


def export_model(directory: Path, model: str = "smollm2") -> Path:
    """An HF-layout copy (weights + tokenizer) of what the worker serves."""
    from frota.engine.loader.export import export_hf

    if not (directory / "config.json").exists():
        export_hf(model, directory, verbose=False)
    return directory


def evaluate(model: str, model_args: dict[str, Any]) -> tuple[float, list[list[float]]]:
    """(accuracy, each question's loglikelihood per choice)."""
    import lm_eval

    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task_config()],
                                  batch_size=1, log_samples=True, verbosity="WARNING")
    accuracy = float(out["results"][TASK]["acc,none"])
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    lls = [[float(resp[0][0]) for resp in s["resps"]] for s in samples]
    return accuracy, lls


def frota_eval(url: str, hf_dir: Path, served: str = "smollm2") -> tuple[float, list[list[float]]]:
    return evaluate("local-completions", {
        "base_url": f"{url}/v1/completions", "model": served, "tokenizer": str(hf_dir),
        "tokenizer_backend": "huggingface", "tokenized_requests": True, "num_concurrent": 1,
        "max_retries": 1})


def transformers_eval(hf_dir: Path) -> tuple[float, list[list[float]]]:
    return evaluate("hf", {"pretrained": str(hf_dir), "dtype": "float32", "device": "cpu"})


def parity(url: str, hf_dir: Path) -> dict[str, Any]:
    """Both accuracies and the largest loglikelihood difference between the two."""
    frota_acc, frota_lls = frota_eval(url, hf_dir)
    hf_acc, hf_lls = transformers_eval(hf_dir)
    diffs = [abs(a - b) for fa, ha in zip(frota_lls, hf_lls, strict=True)
             for a, b in zip(fa, ha, strict=True)]
    return {"task": TASK, "questions": len(frota_lls), "frota_accuracy": frota_acc,
            "transformers_accuracy": hf_acc, "max_loglikelihood_abs_diff": max(diffs)}
