"""LoRA composes with the rest of the engine: float adapters over an int4 base (batched
equals one at a time), bfloat16, and disaggregated prefill/decode (the KV handed over names
its adapter, and the decode side refuses another's)."""

from __future__ import annotations

import pytest

from frota.engine import AdapterError, EngineArgs
from frota.engine.kv_transfer import check_adapter
from frota.engine.llm_engine import LLMEngine
from tests.engine.lora import synthetic
from tests.engine.lora.engines import greedy, run

N = synthetic.NUM_TOKENS


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, loaded):
    """Two adapters: the conftest's first two."""
    return synthetic.make_adapters(tmp_path_factory.mktemp("adapters"), loaded[1], count=2)


def _own(adapters, **kwargs) -> LLMEngine:
    """An engine loading (and quantizing) the model itself, with the adapters loaded."""
    engine = LLMEngine(EngineArgs(model=synthetic.SPEC, verbose=False, num_kv_blocks=64,
                                  max_loras=2, max_lora_rank=8, **kwargs))
    for name, path in adapters.items():
        engine.load_adapter(name, str(path))
    return engine


@pytest.mark.parametrize("kwargs", [{"quantization": "int4"}, {"quantization": "int8"},
                                    {"dtype": "bfloat16"}], ids=["int4", "int8", "bf16"])
def test_adapters_over_another_base_format_batched_equal_one_at_a_time(adapters, kwargs):
    engine = _own(adapters, **kwargs)
    ids = synthetic.prompts(4)
    requests = [("a0", ids[0]), (None, ids[1]), ("a1", ids[2]), ("a0", ids[3])]
    alone = [run(engine, [r], N)[0] for r in requests]
    assert run(engine, requests, N) == alone
    base = run(engine, [(None, ids[0])], N)[0]
    assert alone[0] != base  # the adapter changes this base's output too


def test_the_kv_handed_over_belongs_to_the_requests_adapter(loaded, adapters):
    prefill = synthetic.make_engine(loaded)
    for name, path in adapters.items():
        prefill.load_adapter(name, str(path))
    from frota.engine.kv_transfer import KVTransfer

    transfer = KVTransfer(prefill, on_engine_thread=None)  # type: ignore[arg-type]
    seq = transfer.new_sequence("p", synthetic.prompts(1)[0], greedy(1), keep_kv=True,
                                adapter="a0")
    prefill.add_sequence(seq)
    while prefill.has_unfinished:
        prefill.step()
    header, _ = transfer.export(seq)
    assert header["adapter"] == "a0"
    decode_a0 = transfer.new_sequence("d", synthetic.prompts(1)[0], greedy(1), adapter="a0")
    check_adapter(header, decode_a0)
    for other in ("a1", None):
        with pytest.raises(AdapterError, match="computed under adapter 'a0'"):
            check_adapter(header, transfer.new_sequence("d", [5, 6], greedy(1), adapter=other))
