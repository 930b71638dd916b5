"""One rank of a LoRA tensor-parallel group: greedy tokens of mixed requests under adapters.

Run as `python tp_rank_main.py OUT_DIR TP ADAPTER_DIR...` with FROTA_RANK, FROTA_WORLD_SIZE,
FROTA_MASTER_ADDR, FROTA_MASTER_PORT set; rank 0 writes OUT_DIR/result.json. Two slots for
three adapters, so slots are rewritten (and followers write their shards) mid-run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from frota.server.ranks import exit_now

torch.set_num_threads(1)

NUM_TOKENS = 8


def requests(names: list[str]) -> list[tuple[str | None, list[int]]]:
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 250, (5 + i,), generator=g).tolist() for i in range(6)]
    order = [names[0], None, names[1], names[2], names[0], None]
    return list(zip(order, prompts, strict=True))


def generate(tp: int, adapter_dirs: list[str]) -> list[list[int]] | None:
    """Tokens per request on rank 0 (one batch, then one request at a time); None elsewhere."""
    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine
    from tests.engine.lora.engines import run
    from tests.engine.lora.synthetic import SPEC

    engine = LLMEngine(EngineArgs(model=SPEC, dtype="float32", verbose=False, num_kv_blocks=64,
                                  enable_prefix_caching=False, tensor_parallel_size=tp,
                                  max_loras=2, max_lora_rank=8))
    if engine.parallel is not None and engine.parallel.pc.rank != 0:
        engine.runner.follow()
        return None
    names = [Path(d).name for d in adapter_dirs]
    for name, path in zip(names, adapter_dirs, strict=True):
        engine.load_adapter(name, path)
    reqs = requests(names)
    out = run(engine, reqs[:2] + reqs[4:], NUM_TOKENS)  # two slots: a0 and the base
    out += run(engine, reqs, NUM_TOKENS)  # three adapters: one waits for a slot
    if engine.parallel is not None:
        engine.runner.stop_followers()
    return out


if __name__ == "__main__":
    result = generate(int(sys.argv[2]), sys.argv[3:])
    if result is not None:
        (Path(sys.argv[1]) / "result.json").write_text(json.dumps(result))
    # Once the group has stopped, a peer that closes its sockets first can make the
    # other's gloo teardown abort ("terminate called without an active exception").
    exit_now(0)
