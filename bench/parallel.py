"""Parallel layouts on this machine: decode step time, communication and pipeline bubble.

    python bench/parallel.py [--quick] [--model synthetic:dense-small] [--moe-model synthetic:moe-small]

Layouts: 1 (one process), TP2, PP2 (two micro-batches), EP2 (MoE: tensor 2, experts split 2 ways).
Each rank is its own process (gloo on 127.0.0.1, one torch thread per rank). For decode
batches of 1 and 32 (16-token prompts prefilled first), prints one JSON object per layout:
`step_time_ms` (mean over the timed decode steps, rank 0's wall clock), `comm_fraction`
(time inside collectives / step time, mean over ranks), `bubble_fraction` (PP: time a rank
waits for activations or logits / step time, mean over ranks), per-rank `weight_mb`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# free_port comes from the tests' process harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.processes import free_port

LAYOUTS = {"1": (1, 1, 1), "TP2": (2, 1, 1), "PP2": (1, 2, 1), "EP2": (2, 1, 2)}
BATCHES = (1, 32)


def rank_main(model: str, tp: int, pp: int, ep: int, steps: int) -> None:
    """One rank: rank 0 drives decode steps and prints the measurements as JSON."""
    import torch

    torch.set_num_threads(1)
    from frota.engine import EngineArgs, SamplingParams
    from frota.engine.llm_engine import LLMEngine
    from frota.engine.parallel.loader import shard_bytes

    engine = LLMEngine(EngineArgs(model=model, dtype="float32", device="cpu", verbose=False,
                                  num_kv_blocks=1024, max_model_len=512, max_num_seqs=64,
                                  enable_prefix_caching=False, tensor_parallel_size=tp,
                                  pipeline_parallel_size=pp, expert_parallel_size=ep))
    par = engine.parallel
    if par is not None:
        par.comm.stats.record_history = True
    if par is not None and par.pc.rank != 0:
        engine.runner.follow()
        report = (par.comm.stats.history, shard_bytes(engine.runner.model))
        import torch.distributed as dist

        dist.gather_object(report, None, dst=0, group=par.comm.cpu_group)
        return
    results = {}
    windows = []
    for batch in BATCHES:
        params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"b{batch}-{i}", [(7 * i + j) % 250 + 3 for j in range(16)], params)
        while any(s.num_generated_tokens == 0 for s in engine.scheduler.running) or engine.scheduler.waiting:
            engine.step()
        engine.step()  # one warm decode step
        first = par.comm.stats.num_steps if par is not None else 0
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        windows.append((batch, first, first + steps))
        results[batch] = times
        while engine.has_unfinished:
            engine.step()
    weight = [shard_bytes(engine.runner.model)]
    histories = [par.comm.stats.history] if par is not None else [[]]
    if par is not None:
        engine.runner.stop_followers()
        import torch.distributed as dist

        gathered: list = [None] * par.pc.world_size
        dist.gather_object((par.comm.stats.history, weight[0]), gathered, dst=0,
                           group=par.comm.cpu_group)
        histories = [g[0] for g in gathered]
        weight = [g[1] for g in gathered]
    out = {"step_time_ms": {}, "comm_fraction": {}, "bubble_fraction": {}}
    for batch, lo, hi in windows:
        out["step_time_ms"][str(batch)] = round(1000 * sum(results[batch]) / len(results[batch]), 3)
        comm, bubble = [], []
        for hist in histories:
            window = hist[lo:hi]
            total = sum(h[0] for h in window) or 1.0
            comm.append(sum(h[1] for h in window) / total)
            bubble.append(sum(h[2] for h in window) / total)
        out["comm_fraction"][str(batch)] = round(sum(comm) / len(comm), 4) if par else 0.0
        out["bubble_fraction"][str(batch)] = round(sum(bubble) / len(bubble), 4) if par else 0.0
    out["weight_mb"] = [round(w / 2**20, 2) for w in weight]
    print("RESULT " + json.dumps(out), flush=True)


def run_layout(name: str, model: str, steps: int) -> dict:
    tp, pp, ep = LAYOUTS[name]
    world = tp * pp
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "FROTA_RANK": str(rank), "FROTA_WORLD_SIZE": str(world),
               "FROTA_MASTER_ADDR": "127.0.0.1", "FROTA_MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        argv = [sys.executable, __file__, "--rank-main", model, str(tp), str(pp), str(ep), str(steps)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    line = next((x for x in outs[0].splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"layout {name} failed:\n{outs[0][-2000:]}")
    return {"layout": name, "model": model, "tensor": tp, "pipeline": pp, "expert": ep,
            **json.loads(line.removeprefix("RESULT "))}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        m, tp, pp, ep, steps = sys.argv[2:7]
        rank_main(m, int(tp), int(pp), int(ep), int(steps))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="synthetic:dense-small")
    parser.add_argument("--moe-model", default="synthetic:moe-small")
    parser.add_argument("--quick", action="store_true", help="8 timed steps instead of 32")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    args = parser.parse_args()
    steps = 8 if args.quick else 32
    for name in args.layouts.split(","):
        model = args.moe_model if name == "EP2" else args.model
        print(json.dumps(run_layout(name, model, steps)), flush=True)


if __name__ == "__main__":
    main()
