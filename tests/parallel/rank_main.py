"""One rank of a test group: greedy-decode the prompts, record every sampled row of logits.

Run as `python rank_main.py OUT_DIR MODEL TP PP EP NUM_PROMPTS MAX_TOKENS` with FROTA_RANK,
FROTA_WORLD_SIZE, FROTA_MASTER_ADDR, FROTA_MASTER_PORT set; rank 0 writes OUT_DIR/result.pt.
With TP=PP=1 it is the single-process reference.
"""

from __future__ import annotations

import sys

import torch

torch.set_num_threads(1)


def prompts(num: int) -> list[list[int]]:
    """Distinct prompts of different lengths (token ids valid for every test model)."""
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(3, 250, (5 + 3 * i,), generator=g).tolist() for i in range(num)]


def main() -> int:
    out_dir, model, tp, pp, ep, num, max_tokens = sys.argv[1:8]
    from frota.engine import EngineArgs, SamplingParams
    from frota.engine.llm_engine import LLMEngine

    args = EngineArgs(model=model, dtype="float32", device="cpu", verbose=False,
                      num_kv_blocks=256, max_model_len=256, enable_prefix_caching=False,
                      tensor_parallel_size=int(tp), pipeline_parallel_size=int(pp),
                      expert_parallel_size=int(ep))
    engine = LLMEngine(args)
    if engine.parallel is not None and engine.parallel.pc.rank != 0:
        engine.runner.follow()
        return 0
    logits_by_request: dict[str, list[torch.Tensor]] = {}
    sample = engine.sampler.__call__

    def recording(logits, seqs):  # type: ignore[no-untyped-def]
        for row, seq in zip(logits, seqs, strict=True):
            logits_by_request.setdefault(seq.request_id, []).append(row.clone())
        return sample(logits, seqs)

    engine.sampler = recording  # type: ignore[assignment]
    params = SamplingParams(max_tokens=int(max_tokens), temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(int(num))):
        engine.add_request(f"r{i}", p, params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished:
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    result = {
        "tokens": [tokens[f"r{i}"] for i in range(int(num))],
        "logits": [torch.stack(logits_by_request[f"r{i}"]) for i in range(int(num))],
        "expert_tokens": engine.stats().expert_tokens,
    }
    if engine.parallel is not None:
        engine.runner.stop_followers()
    torch.save(result, f"{out_dir}/result.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
