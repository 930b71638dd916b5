"""The slot pool: its bytes are the planner's, the least recently used idle slot is evicted,
a pinned one never is, requests wait for a slot without holding up the base model's, and
"no adapter" never reads a slot."""

from __future__ import annotations

import pytest

from frota.api.memory import lora_slot_bytes
from tests.engine.lora import synthetic
from tests.engine.lora.engines import greedy, run

N = synthetic.NUM_TOKENS


@pytest.fixture(scope="module")
def want(loaded, adapters):
    """One request at a time, each adapter (and the base model) alone: the references."""
    engine = synthetic.make_engine(loaded, max_loras=3)
    for name, path in adapters.items():
        engine.load_adapter(name, str(path))
    ids = synthetic.prompts(4)
    return {(name, i): run(engine, [(name, ids[i])], N)[0]
            for name in (None, *adapters) for i in range(4)}


def _engine(loaded, adapters, **kwargs):
    engine = synthetic.make_engine(loaded, **kwargs)
    for name, path in adapters.items():
        engine.load_adapter(name, str(path))
    return engine


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_pool_allocates_what_the_memory_plan_reserves(loaded, dtype):
    engine = synthetic.make_engine(loaded, max_loras=3, max_lora_rank=8, dtype=dtype)
    assert engine.lora.pool.nbytes() == 3 * lora_slot_bytes(engine.model_config, 8, dtype)


def test_adapters_differ_from_each_other_and_from_the_base(want):
    outs = {name: want[(name, 0)] for name in (None, "a0", "a1", "a2")}
    assert len({tuple(v) for v in outs.values()}) == 4, outs


def test_more_adapters_than_slots_evict_the_least_recently_used_idle_one(loaded, adapters, want):
    engine = _engine(loaded, adapters, max_loras=2)
    ids = synthetic.prompts(4)
    for name in ("a0", "a1", "a0", "a2", "a1"):  # a2 evicts a1 (idle longest), a1 then a0
        assert run(engine, [(name, ids[0])], N) == [want[(name, 0)]]
        resident = {i.name for i in engine.adapters() if i.resident}
        assert name in resident and len(resident) <= 2
    assert {i.name for i in engine.adapters() if i.resident} == {"a1", "a2"}
    assert engine.lora.pool.num_evictions == 2


def test_a_request_waits_for_a_slot_while_base_requests_behind_it_run(loaded, adapters, want):
    engine = _engine(loaded, adapters, max_loras=1)
    ids = synthetic.prompts(4)
    order = [("a0", 0), ("a1", 1), (None, 2), ("a0", 3)]
    for i, (name, p) in enumerate(order):
        engine.add_request(f"r{i}", ids[p], greedy(N), adapter=name)
    tokens = {f"r{i}": [] for i in range(4)}
    for out in engine.step():
        tokens[out.request_id].extend(out.new_token_ids)
    running = {s.request_id for s in engine.scheduler.running}
    # a1 has no slot (a0 holds the only one): the base request is admitted past it, and a0's
    # second request waits behind a1 so that a1 is not starved
    assert running == {"r0", "r2"}
    stats = engine.stats()
    assert stats.running_adapters == ("a0",) and stats.waiting_adapters == ("a0", "a1")
    assert stats.max_adapters == 1
    while engine.has_unfinished:
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    assert [tokens[f"r{i}"] for i in range(4)] == [want[o] for o in order]


def test_base_rows_never_read_a_slot_even_with_every_slot_full(loaded, adapters, want):
    engine = _engine(loaded, adapters, max_loras=2)
    ids = synthetic.prompts(4)
    requests = [("a0", ids[0]), ("a1", ids[1]), (None, ids[2]), (None, ids[3])]
    assert run(engine, requests, N) == [want[("a0", 0)], want[("a1", 1)], want[(None, 2)],
                                        want[(None, 3)]]


def test_a_preempted_request_resumes_under_its_adapter(loaded, adapters, want):
    # 4 blocks of 4 tokens: two sequences of 14+ tokens cannot both stay, one is preempted
    engine = _engine(loaded, adapters, max_loras=2, num_kv_blocks=7, block_size=4)
    ids = synthetic.prompts(4)
    got = run(engine, [("a0", ids[2]), ("a1", ids[3])], N)
    assert engine.scheduler.num_preemptions > 0
    assert got == [want[("a0", 2)], want[("a1", 3)]]
    assert all(not i.resident or engine.lora.pool.idle for i in engine.adapters())
