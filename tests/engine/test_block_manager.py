"""Block accounting, prefix caching and scheduling, without a model (tokens are faked)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from frota.engine.block_manager import BlockManager
from frota.engine.sampling_params import SamplingParams
from frota.engine.scheduler import Scheduler
from frota.engine.sequence import Sequence, SequenceStatus
from frota.engine.stopping import StopRule


def make_seq(rid: str, n: int, max_tokens: int = 4, base: int = 0) -> Sequence:
    return Sequence(rid, [base + i for i in range(n)], SamplingParams(max_tokens=max_tokens))


def fake_step(sched: Scheduler, max_model_len: int = 64) -> list[Sequence]:
    """Schedule, pretend to compute, sample a fixed token; finish by max_tokens or length."""
    batch = sched.schedule()
    done = []
    for seq in sched.postprocess(batch):
        seq.append_token(7)
        reason = StopRule((), max_model_len).finish_reason(seq)
        if reason:
            sched.finish(seq, reason)
            done.append(seq)
    return done


def run_until_finished(sched: Scheduler, seq: Sequence, max_model_len: int = 64) -> None:
    """Step until `seq` is finished (the other sequences step along)."""
    while not seq.is_finished:
        fake_step(sched, max_model_len)


def scheduler(num_blocks: int, block_size: int, *, max_num_seqs: int = 4,
              max_num_batched_tokens: int = 64) -> tuple[BlockManager, Scheduler]:
    bm = BlockManager(num_blocks=num_blocks, block_size=block_size)
    return bm, Scheduler(bm, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens)


def assert_no_leaks(bm: BlockManager) -> None:
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_cache_hit_shares_full_blocks_and_counts_tokens():
    bm, sched = scheduler(16, 4)
    a = make_seq("a", 10)
    sched.add(a)
    run_until_finished(sched, a)
    b = make_seq("b", 10)
    sched.add(b)
    fake_step(sched)
    assert b.num_cached_tokens == 8  # two full blocks of the shared 10-token prompt
    assert bm.prefix_cache_queries == 20 and bm.prefix_cache_hits == 8
    run_until_finished(sched, b)
    assert_no_leaks(bm)


def test_full_prompt_hit_still_computes_one_token():
    bm, sched = scheduler(16, 4)
    for rid in ("a", "b"):
        seq = make_seq(rid, 8)
        sched.add(seq)
        batch = sched.schedule()
        assert batch.num_new_tokens[0] == (8 if rid == "a" else 4)
        for done in sched.postprocess(batch):
            done.append_token(7)
        run_until_finished(sched, seq)
    assert_no_leaks(bm)


def test_freed_cached_blocks_are_evicted_least_recently_used_first():
    bm, sched = scheduler(4, 2)
    old = make_seq("old", 3, max_tokens=1, base=100)
    sched.add(old)
    run_until_finished(sched, old, 8)
    cached = set(bm.hash_to_block.values())
    assert cached  # the first block of "old" is cached while free
    new = make_seq("new", 5, max_tokens=1, base=200)  # needs 3 blocks of 4: eviction order matters
    sched.add(new)
    run_until_finished(sched, new, 8)
    assert_no_leaks(bm)


def test_chunked_prefill_splits_long_prompt_and_mixes_with_decode():
    _, sched = scheduler(64, 4, max_num_batched_tokens=8)
    short = make_seq("short", 3, max_tokens=20)
    sched.add(short)
    fake_step(sched, 128)
    long = make_seq("long", 30, max_tokens=2, base=50)
    sched.add(long)
    batch = sched.schedule()
    assert batch.seqs == [short, long] and batch.num_new_tokens == [1, 7]
    sched.postprocess(batch)
    assert long.num_computed_tokens == 7 and long.num_generated_tokens == 0


def test_preemption_when_blocks_run_out_then_everything_finishes():
    bm, sched = scheduler(6, 4, max_num_seqs=8)
    seqs = [make_seq(f"s{i}", 6, max_tokens=12, base=10 * i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    for _ in range(500):
        if not sched.has_work:
            break
        fake_step(sched, 24)
    assert all(s.is_finished and s.num_generated_tokens == 12 for s in seqs)
    assert sched.num_preemptions > 0
    assert_no_leaks(bm)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(4, 40),
    block_size=st.sampled_from([1, 2, 4, 16]),
    budget=st.integers(1, 64),
    caching=st.booleans(),
)
def test_random_arrivals_and_aborts_never_leak_or_deadlock(seed, num_blocks, block_size, budget, caching):
    rng = random.Random(seed)
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    max_len = num_blocks * block_size
    sched = Scheduler(bm, max_num_seqs=rng.randint(1, 8), max_num_batched_tokens=budget)
    live: list[Sequence] = []
    for step in range(50_000):
        if step < 100 and rng.random() < 0.3:
            n = rng.randint(1, max_len)
            # shared prefixes exercise the cache
            base = rng.choice([0, 0, 1000 * step])
            seq = make_seq(f"r{step}", n, max_tokens=rng.randint(1, 8), base=base)
            sched.add(seq)
            live.append(seq)
        if live and rng.random() < 0.1:
            victim = rng.choice(live)
            sched.finish(victim, "abort")
        fake_step(sched, max_len)
        live = [s for s in live if not s.is_finished]
        used = sum(1 for b in bm.blocks if b.ref_count > 0)
        assert used == bm.num_used_blocks
        assert all(s.status != SequenceStatus.FINISHED for s in sched.running)
        if step >= 100 and not sched.has_work:
            break
    assert not sched.has_work, "work left long after the last arrival: a deadlock"
    assert_no_leaks(bm)
