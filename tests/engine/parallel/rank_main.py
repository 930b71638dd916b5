"""One rank of a test group: greedy-decode the prompts, record every sampled row of logits.

Run as `python rank_main.py OUT_DIR MODEL TP PP EP NUM_PROMPTS MAX_TOKENS` with FROTA_RANK,
FROTA_WORLD_SIZE, FROTA_MASTER_ADDR, FROTA_MASTER_PORT set; rank 0 writes OUT_DIR/result.pt.
With TP=PP=1 it is the single-process reference.
"""

from __future__ import annotations

import os
import sys

import torch

from frota.server.ranks import exit_now

torch.set_num_threads(1)


def prompts(num: int) -> list[list[int]]:
    """Distinct prompts of different lengths (token ids valid for every test model)."""
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(3, 250, (5 + 3 * i,), generator=g).tolist() for i in range(num)]


def generate(model: str, tp: int = 1, pp: int = 1, ep: int = 1, num: int = 8,
             max_tokens: int = 32) -> dict | None:
    """Greedy tokens and sampled logits rows per prompt; None on follower ranks."""
    from frota.engine import EngineArgs, SamplingParams
    from frota.engine.llm_engine import LLMEngine

    args = EngineArgs(model=model, dtype="float32",
                      device=os.environ.get("TEST_DEVICE", "cpu"), verbose=False,
                      num_kv_blocks=256, max_model_len=256, enable_prefix_caching=False,
                      tensor_parallel_size=tp, pipeline_parallel_size=pp, expert_parallel_size=ep)
    engine = LLMEngine(args)
    if engine.parallel is not None and engine.parallel.pc.rank != 0:
        engine.runner.follow()
        return None
    logits_by_request: dict[str, list[torch.Tensor]] = {}
    sample = engine.sampler.__call__

    def recording(logits, seqs):  # type: ignore[no-untyped-def]
        for row, seq in zip(logits, seqs, strict=True):
            logits_by_request.setdefault(seq.request_id, []).append(row.clone())
        return sample(logits, seqs)

    engine.sampler = recording  # type: ignore[assignment]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(num)):
        engine.add_request(f"r{i}", p, params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished:
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    result = {
        "tokens": [tokens[f"r{i}"] for i in range(num)],
        "logits": [torch.stack(logits_by_request[f"r{i}"]) for i in range(num)],
        "expert_tokens": engine.stats().expert_tokens,
        "num_computed_tokens": sum(len(p) + max_tokens - 1 for p in prompts(num)),
    }
    if engine.parallel is not None:
        engine.runner.stop_followers()
    return result


def main() -> int:
    out_dir, model, tp, pp, ep, num, max_tokens = sys.argv[1:8]
    model = os.environ.get("TEST_MODEL_OVERRIDE", model)  # a mismatched rank, on purpose
    result = generate(model, int(tp), int(pp), int(ep), int(num), int(max_tokens))
    if result is not None:
        torch.save(result, f"{out_dir}/result.pt")
    return 0


if __name__ == "__main__":
    # Once the group has stopped, a peer that closes its sockets first can make the
    # other's gloo teardown abort.
    exit_now(main())
