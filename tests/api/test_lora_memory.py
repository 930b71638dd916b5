"""One LoRA slot's bytes (`frota.api.memory.lora_slot_bytes`): the planner reserves them and
the engine's slot pool allocates them, so the figure is pinned here by hand."""

from __future__ import annotations

import pytest

from frota.api.memory import ModelShape, lora_slot_bytes

# small enough to count by hand: h=64, q=4 heads x 16, kv=2 heads x 16, ff=128, 3 layers
SHAPE = ModelShape(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=3,
                   num_heads=4, num_kv_heads=2, head_dim=16)


def test_a_slot_holds_a_and_b_of_every_target_of_every_layer() -> None:
    r = 8
    # q (64<-64), k and v (32<-64), o (64<-64), gate and up (128<-64), down (64<-128)
    per_layer = r * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64))
    assert lora_slot_bytes(SHAPE, r, "bfloat16") == 3 * per_layer * 2
    assert lora_slot_bytes(SHAPE, r, "float32") == 3 * per_layer * 4


def test_a_slot_grows_with_its_rank() -> None:
    assert lora_slot_bytes(SHAPE, 32, "bfloat16") == 4 * lora_slot_bytes(SHAPE, 8, "bfloat16")


def test_tensor_parallel_shards_b_of_column_and_a_of_row_parallel_projections() -> None:
    r, t = 8, 2
    # column-parallel: A [r, in] whole, B [out/t, r]; row-parallel: A [r, in/t], B [out, r] whole
    q = 64 + 64 // t
    kv = 64 + 32 // t
    o = 64 // t + 64
    gate_up = 64 + 128 // t
    down = 128 // t + 64
    per_layer = r * (q + 2 * kv + o + 2 * gate_up + down)
    assert lora_slot_bytes(SHAPE, r, "bfloat16", tensor=t) == 3 * per_layer * 2


def test_kv_heads_are_replicated_past_their_count() -> None:
    r = 8
    one_head = 16
    slot = lora_slot_bytes(SHAPE, r, "float32", tensor=4)
    q, o = 64 + 64 // 4, 64 // 4 + 64
    gate_up, down = 64 + 128 // 4, 128 // 4 + 64
    kv = 64 + one_head  # 2 KV heads over 4 ranks: each rank keeps one
    assert slot == 3 * r * (q + 2 * kv + o + 2 * gate_up + down) * 4


def test_pipeline_stages_hold_their_own_layers() -> None:
    assert lora_slot_bytes(SHAPE, 8, "bfloat16", pipeline=3) * 3 == lora_slot_bytes(SHAPE, 8, "bfloat16")


def test_a_mixture_of_experts_is_targeted_on_attention_only() -> None:
    moe = ModelShape(**{**SHAPE.__dict__, "num_experts": 4})
    r = 8
    assert lora_slot_bytes(moe, r, "bfloat16") == 3 * r * ((64 + 64) + 2 * (64 + 32) + (64 + 64)) * 2


def test_a_rank_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 0"):
        lora_slot_bytes(SHAPE, 0, "bfloat16")
