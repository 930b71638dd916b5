"""Sizes that do not divide the model are refused before start, naming the sizes; ranks
started with different configs are refused at join time."""

from __future__ import annotations

import pytest

from frota.engine.parallel.config import ParallelConfig, ParallelConfigError, validate_model
from tests.engine.parallel.conftest import run_group

SMOLLM2 = dict(num_heads=9, num_kv_heads=3, num_layers=30, intermediate_size=1536, num_experts=0)


def test_tensor_size_that_does_not_divide_the_heads_is_rejected_naming_both():
    with pytest.raises(ParallelConfigError, match=r"tensor-parallel size 2 .* 9 attention heads"):
        validate_model(ParallelConfig(tensor=2), **SMOLLM2)


def test_smollm2_splits_three_ways():
    validate_model(ParallelConfig(tensor=3), **SMOLLM2)


def test_pipeline_size_that_does_not_divide_the_layers_is_rejected():
    with pytest.raises(ParallelConfigError, match=r"pipeline-parallel size 4 .* 30 layers"):
        validate_model(ParallelConfig(pipeline=4), **SMOLLM2)


def test_expert_size_that_does_not_divide_the_experts_is_rejected():
    moe = dict(num_heads=4, num_kv_heads=2, num_layers=2, intermediate_size=96, num_experts=6)
    with pytest.raises(ParallelConfigError, match=r"expert-parallel size 4 .* 6 experts"):
        validate_model(ParallelConfig(tensor=4, expert=4), **moe)


def test_expert_size_must_divide_the_tensor_size():
    with pytest.raises(ParallelConfigError, match="must divide tensor-parallel size 2"):
        ParallelConfig(tensor=2, expert=4)


def test_fewer_kv_heads_than_ranks_replicates_them_when_it_divides():
    dense = dict(num_heads=8, num_kv_heads=2, num_layers=2, intermediate_size=128, num_experts=0)
    validate_model(ParallelConfig(tensor=4), **dense)
    with pytest.raises(ParallelConfigError, match="3 KV heads"):
        validate_model(ParallelConfig(tensor=2), **{**dense, "num_heads": 6, "num_kv_heads": 3,
                                                    "intermediate_size": 128})


def test_world_size_from_the_planner_must_match_the_flags():
    with pytest.raises(ParallelConfigError, match="FROTA_WORLD_SIZE=4"):
        ParallelConfig.from_env(tensor=2, environ={"FROTA_WORLD_SIZE": "4", "FROTA_RANK": "1"})


def test_dividing_error_reaches_the_user_from_a_real_rank(tmp_path):
    # Three heads (like SmolLM2's nine) cannot be split over two ranks.
    model = "synthetic:dense-tiny,heads=3,kv_heads=1,head_dim=16"
    result, outcomes = run_group(tmp_path, model, 2, num=1, max_tokens=1)
    assert result is None
    assert all(o.returncode != 0 for o in outcomes)
    assert "tensor-parallel size 2 does not divide the model's 3 attention heads" in outcomes[0].stdout


def test_ranks_with_different_models_are_refused_at_join(tmp_path):
    other = {"TEST_MODEL_OVERRIDE": "synthetic:dense-tiny,seed=7"}
    result, outcomes = run_group(tmp_path, "synthetic:dense-tiny", 2, num=1, max_tokens=1,
                                 env_by_rank={1: other})
    assert result is None
    assert all(o.returncode != 0 for o in outcomes)
    assert "started with different configs (model" in outcomes[0].stdout + outcomes[1].stdout
