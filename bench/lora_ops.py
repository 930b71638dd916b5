"""The LoRA delta's paths on this machine, timed: the C++ gather kernel (`lora_ops.cpp`, what
decode rows take on the CPU) against the torch gather it replaced and the segment path.
Prints one JSON object.

Per case (rows, slots), each including the base projection: the kernel and the torch gather
(`frota.engine.lora.ops.add_lora` with every row a decode row), the segment path (the same
rows as one segment per slot), and the base projection alone, for SmolLM2-135M's fused
q/k/v shape at rank 16.

    .venv/bin/python bench/lora_ops.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from frota.engine.lora import ops
from frota.engine.lora.batch import LoRABatch
from frota.engine.lora.ops import add_lora
from frota.engine.lora.slots import SlotProjection

HIDDEN, Q, KV, RANK = 576, 576, 192, 16


def torch_gather(y, x, proj, batch):
    """`add_lora` on torch's ops alone (as with FROTA_CPU_KERNELS=0)."""
    kernel, ops.gather_kernel = ops.gather_kernel, lambda x, proj: None
    try:
        return add_lora(y, x, proj, batch)
    finally:
        ops.gather_kernel = kernel


def _time(fn, repeat: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat * 1e6  # microseconds


def case(base: torch.nn.Module, rows: int, slots: int, repeat: int) -> dict:
    """Microseconds of one projection of `rows` rows spread over `slots` adapters."""
    proj = SlotProjection("qkv_proj", HIDDEN, [Q, KV, KV], slots, RANK, torch.float32,
                          torch.device("cpu"))
    proj.a.normal_()
    for b in proj.b:
        b.normal_()
    for slot in range(slots):  # every slot a rank-RANK adapter of q, k and v
        for j in range(len(proj.b)):
            proj.set_rank(slot, j, RANK)
    x = torch.randn(rows, HIDDEN)
    slot_of = torch.arange(rows) % slots
    gather = LoRABatch(torch.arange(rows), slot_of, [])
    xs = x[slot_of.argsort(stable=True)]  # rows grouped by slot: one segment each
    ends = torch.bincount(slot_of, minlength=slots).cumsum(0).tolist()
    starts = [0, *ends[:-1]]
    segments = LoRABatch(None, None, [(s, e, i) for i, (s, e) in
                                      enumerate(zip(starts, ends, strict=True)) if e > s])
    return {
        "rows": rows, "slots": slots, "rank": RANK,
        "base_us": round(_time(lambda: base(x), repeat), 1),
        "kernel_us": round(_time(lambda: add_lora(base(x), x, proj, gather), repeat), 1)
        if ops.gather_kernel(x, proj) is not None else None,
        "torch_gather_us": round(_time(lambda: torch_gather(base(x), x, proj, gather), repeat), 1),
        "segments_us": round(_time(lambda: add_lora(base(xs), xs, proj, segments), repeat), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = torch.nn.Linear(HIDDEN, Q + 2 * KV, bias=False)
    with torch.inference_mode():
        results = [case(base, rows, slots, args.repeat)
                   for rows, slots in ((1, 1), (8, 4), (32, 4), (64, 8))]
    print(json.dumps({"bench": "lora_ops", "threads": 1, "cases": results}))


if __name__ == "__main__":
    main()
