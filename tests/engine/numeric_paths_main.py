"""One process of tests/engine/test_numeric_paths.py: SmolLM2's numeric paths under the kernel
switches of its environment, which are read once per process.

Run as `python numeric_paths_main.py REFERENCE OUT`. REFERENCE (torch.save) holds the
prompts, transformers' greedy continuations of them and transformers' logits predicting
those; OUT gets, for each path, its teacher-forced `Agreement` with its reference and the
kernel paths it ran (`frota.engine.numeric_paths.describe`), and the model's shape.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests` as a package

from frota.engine import EngineArgs  # noqa: E402
from frota.engine import numeric_paths as paths  # noqa: E402
from frota.engine.kernels.linear import pack_linears  # noqa: E402
from frota.engine.llm_engine import LLMEngine  # noqa: E402
from frota.engine.loader import load_model  # noqa: E402
from tests.engine import teacher_forced as tf  # noqa: E402

ARGS = dict(model="smollm2", num_kv_blocks=32, verbose=False)


def packed(loaded: tuple) -> tuple:
    """A copy of the loaded float32 model with its linears packed as the engine's own load
    packs them (`frota.engine.compute.prepare_cpu`), without reading the file again."""
    model, cfg, tokenizer = loaded
    model = copy.deepcopy(model)
    pack_linears(model)
    return model, cfg, tokenizer


def main(reference_path: str, out_path: str) -> None:
    reference = torch.load(reference_path)
    prompts, forced = reference["prompts"], reference["continuations"]
    loaded = load_model("smollm2", torch.float32, torch.device("cpu"), verbose=False)
    packed_loaded = packed(loaded)  # before a step caches its kernels' state on the model
    plain = LLMEngine(EngineArgs(dtype="float32", **ARGS), loaded=loaded)  # nothing packed
    plain_logits = tf.teacher_forced_logits(plain, prompts, forced)
    out: dict = {"cfg": plain.model_config, "paths": {"float32 plain": paths.describe(plain.runner.model)},
                 "agreements": {}}
    out["agreements"]["float32 plain"] = tf.compare(reference["logits"], plain_logits, forced)
    out["tokens"] = [logits.argmax(-1).tolist() for logits in plain_logits]
    others = {
        "float32 packed": lambda: LLMEngine(EngineArgs(dtype="float32", **ARGS), loaded=packed_loaded),
        "int8 KV": lambda: LLMEngine(EngineArgs(dtype="float32", kv_cache_dtype="int8", **ARGS), loaded=loaded),
        "int4": lambda: LLMEngine(EngineArgs(dtype="float32", quantization="int4", **ARGS)),
        "bfloat16": lambda: LLMEngine(EngineArgs(dtype="bfloat16", **ARGS)),
    }
    for name, make in others.items():
        engine = make()
        out["paths"][name] = paths.describe(engine.runner.model)
        out["agreements"][name] = tf.compare(plain_logits, tf.teacher_forced_logits(engine, prompts, forced),
                                             forced)
        del engine
    torch.save(out, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
