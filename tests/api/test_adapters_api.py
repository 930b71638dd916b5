"""spec.adapters and spec.engine.lora: which specs turn LoRA on, and with what slots."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from frota.api import InferenceServiceSpec, LoRA

MODEL = {"name": "base", "uri": "alias:smollm2"}


def _spec(**fields) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": MODEL, **fields})


def test_no_adapters_and_no_lora_block_is_lora_off():
    assert _spec().lora is None


def test_listing_adapters_turns_lora_on_with_the_defaults():
    spec = _spec(adapters=[{"name": "sql", "uri": "hf://org/sql"}])
    assert spec.lora == LoRA()
    assert (spec.lora.maxAdapters, spec.lora.maxRank, spec.lora.allowRuntimeLoading) == (4, 16, False)


def test_a_lora_block_alone_turns_lora_on_for_runtime_loading():
    spec = _spec(engine={"lora": {"maxAdapters": 2, "allowRuntimeLoading": True}})
    assert spec.lora == LoRA(maxAdapters=2, allowRuntimeLoading=True)


def test_more_adapters_than_slots_is_allowed():
    adapters = [{"name": f"a{i}", "uri": f"hf://org/a{i}"} for i in range(3)]
    assert len(_spec(adapters=adapters, engine={"lora": {"maxAdapters": 1}}).adapters) == 3


@pytest.mark.parametrize(("adapters", "fragment"), [
    ([{"name": "base", "uri": "hf://org/a"}], "must differ from spec.model.name"),
    ([{"name": "a", "uri": "hf://org/a"}, {"name": "a", "uri": "hf://org/b"}], "must be unique"),
    ([{"name": "a=b", "uri": "hf://org/a"}], "pattern"),
    ([{"name": "a", "uri": "synthetic:tiny"}], "pattern"),
])
def test_bad_adapters_are_refused(adapters, fragment):
    with pytest.raises(ValidationError, match=fragment):
        _spec(adapters=adapters)


def test_lora_rank_is_one_of_the_slot_ranks():
    with pytest.raises(ValidationError):
        LoRA(maxRank=12)
    assert LoRA(maxRank=256).maxRank == 256
