"""Loading adapters: what a bad one is told (by message and code), that nothing else is
affected by it, and the names the API answers with."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from frota.engine import AdapterError
from tests.engine.lora import synthetic
from tests.engine.lora.adapters import write_adapter
from tests.engine.lora.engines import greedy, run


@pytest.fixture(scope="module")
def good(tmp_path_factory, loaded):
    return write_adapter(tmp_path_factory.mktemp("good"), loaded[1], rank=4,
                         targets=["q_proj", "down_proj"], seed=1, scale=0.5)


def _copy(good, tmp_path, config: dict | None = None):
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    if config is not None:
        cfg = json.loads((bad / "adapter_config.json").read_text())
        (bad / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
    return bad


def test_an_adapter_loads_and_lists_with_its_rank_and_targets(loaded, good):
    engine = synthetic.make_engine(loaded)
    info = engine.load_adapter("good", str(good))
    assert (info.name, info.rank, info.targets, info.resident) == ("good", 4, ("q_proj", "down_proj"), False)
    run(engine, [("good", synthetic.prompts(1)[0])], 2)
    assert [(i.name, i.resident) for i in engine.adapters()] == [("good", True)]


def _bad_cases(good, tmp_path, loaded):
    shape = loaded[1]
    other = type(shape)(**{**shape.__dict__, "hidden_size": 32, "head_dim": 8})
    yield "wrong base shape", write_adapter(tmp_path / "shape", other, rank=4, targets=["q_proj"])
    yield "rank 32 is above max_lora_rank 8", write_adapter(tmp_path / "rank", shape, rank=32,
                                                            targets=["q_proj"])
    yield "unsupported target module(s) lm_head", _copy(good, tmp_path / "t",
                                                        {"target_modules": ["q_proj", "lm_head"]})
    yield "adapter_config.json is missing", _without(good, tmp_path / "m1", "adapter_config.json")
    yield "adapter_model.safetensors is missing", _without(good, tmp_path / "m2",
                                                           "adapter_model.safetensors")
    corrupt = _copy(good, tmp_path / "c")
    data = (corrupt / "adapter_model.safetensors").read_bytes()
    (corrupt / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    yield "adapter_model.safetensors in", corrupt
    yield "does not exist", tmp_path / "no-such-dir"
    yield "DoRA is not supported", _copy(good, tmp_path / "d", {"use_dora": True})


def _without(good, tmp_path, name):
    bad = _copy(good, tmp_path)
    (bad / name).unlink()
    return bad


def test_each_bad_adapter_is_an_error_naming_what_is_wrong(loaded, good, tmp_path):
    engine = synthetic.make_engine(loaded)
    for message, path in _bad_cases(good, tmp_path, loaded):
        with pytest.raises(AdapterError, match=re.escape(message)) as err:
            engine.load_adapter("bad", str(path))
        assert err.value.code == "invalid_adapter"
        assert engine.adapters() == []


def test_a_corrupt_file_says_corrupt(loaded, good, tmp_path):
    engine = synthetic.make_engine(loaded)
    corrupt = _copy(good, tmp_path)
    data = (corrupt / "adapter_model.safetensors").read_bytes()
    (corrupt / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="is corrupt"):
        engine.load_adapter("bad", str(corrupt))


def test_a_name_taken_an_unknown_name_and_lora_off_have_their_codes(loaded, good):
    engine = synthetic.make_engine(loaded)
    engine.load_adapter("x", str(good))
    with pytest.raises(AdapterError, match="already loaded") as err:
        engine.load_adapter("x", str(good))
    assert err.value.code == "adapter_exists"
    with pytest.raises(AdapterError, match="no adapter named 'y'") as err:
        engine.add_request("r", [5, 6, 7], greedy(2), adapter="y")
    assert err.value.code == "adapter_not_found"
    with pytest.raises(AdapterError) as err:
        engine.unload_adapter("y")
    assert err.value.code == "adapter_not_found"
    off = synthetic.make_engine(loaded, max_loras=0)
    with pytest.raises(AdapterError, match="LoRA is not enabled") as err:
        off.load_adapter("x", str(good))
    assert err.value.code == "lora_disabled"
    assert off.stats().max_adapters == 0


def test_a_bad_load_while_requests_run_changes_nothing_for_them(loaded, good, tmp_path):
    ids = synthetic.prompts(2)
    want = run(synthetic.make_engine(loaded), [(None, ids[0])], synthetic.NUM_TOKENS)
    engine = synthetic.make_engine(loaded)
    engine.load_adapter("good", str(good))
    want += run(engine, [("good", ids[1])], synthetic.NUM_TOKENS)
    engine = synthetic.make_engine(loaded)
    engine.load_adapter("good", str(good))
    engine.add_request("base", ids[0], greedy(synthetic.NUM_TOKENS))
    engine.add_request("good", ids[1], greedy(synthetic.NUM_TOKENS), adapter="good")
    tokens = {"base": [], "good": []}
    bad = iter(path for _, path in _bad_cases(good, tmp_path, loaded))
    while engine.has_unfinished:
        path = next(bad, None)
        if path is not None:
            with pytest.raises(AdapterError):
                engine.load_adapter("good" if path.name == "c" else "other", str(path))
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    assert [tokens["base"], tokens["good"]] == want
