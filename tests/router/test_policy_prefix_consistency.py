"""prefix-aware across routers: two routers with no shared state, each seeing the traffic in
its own order, send the same prefix to the same worker."""

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frota.router.health import Worker
from frota.router.policies import PrefixAwareConfig, PrefixAwarePolicy, RouteRequest


def chat(*contents: str) -> RouteRequest:
    messages = [{"role": "system" if i == 0 else "user", "content": c}
                for i, c in enumerate(contents)]
    return RouteRequest("/v1/chat/completions", json.dumps({"messages": messages}).encode())


def tenant_prompt(tenant: int, question: int) -> RouteRequest:
    system = f"You are the assistant of tenant {tenant}. Follow its rules and examples. " * 6
    return chat(system, f"Question {question}: what does the fleet do next?")


def workers(n: int) -> list[Worker]:
    # Each router discovers its own Worker objects for the same URLs.
    return [Worker(f"http://10.0.0.{i}:8000") for i in range(n)]


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(2, 4))
def test_two_routers_place_each_tenant_alike_whatever_order_they_see(rng, num_workers):
    # 12 tenants, 16 questions each, in two random orders. With the window full (64), no
    # tenant can be hot (16 < 64 x 1.25 / 4); before that, a tenant that happens to
    # bring many of the first requests may be, so only later requests are compared.
    requests = [(t, q) for t in range(12) for q in range(16)]
    placed = []
    for _ in range(2):
        policy, pool, order = PrefixAwarePolicy(), workers(num_workers), requests[:]
        rng.shuffle(order)
        decisions = [policy.choose(tenant_prompt(*r), pool).worker.url for r in order]
        placed.append({r: url for i, (r, url) in enumerate(zip(order, decisions, strict=True))
                       if i >= 64})
    both = placed[0].keys() & placed[1].keys()
    assert len(both) > 40
    assert all(placed[0][r] == placed[1][r] for r in both)
    # ... and one tenant's questions all meet on one worker.
    for tenant in range(12):
        assert len({url for (t, _), url in placed[0].items() if t == tenant}) <= 1


def interleaved_turns(rng: random.Random, num_conversations: int,
                      num_turns: int) -> list[tuple[int, int]]:
    """(conversation, turn) in a random interleaving that keeps each chat's turns in order."""
    next_turn = dict.fromkeys(range(num_conversations), 0)
    out = []
    while next_turn:
        conv = rng.choice(sorted(next_turn))
        out.append((conv, next_turn[conv]))
        next_turn[conv] += 1
        if next_turn[conv] == num_turns:
            del next_turn[conv]
    return out


def chat_turn(conv: int, turn: int) -> RouteRequest:
    system = "You are a terse assistant of one app; every conversation starts here. " * 2
    history = [system]
    for t in range(turn + 1):
        history.append(f"conversation {conv} turn {t}: a question long enough to fill "
                       "more than a block of its own, then some more words after that")
    return chat(*history)


@pytest.mark.parametrize("seed", range(4))
def test_two_routers_keep_each_conversation_on_one_worker_under_a_hot_system_prompt(seed):
    # Every conversation opens with the same system prompt (hot in both routers), so each
    # is placed by its own opening. Router A gets the odd requests of one interleaving,
    # router B the even ones of another: each sees half the turns, in its own order, and
    # once both have seen a window's worth, they agree on every conversation's worker.
    rng = random.Random(seed)
    config = PrefixAwareConfig(hot_window=64)
    a, b = PrefixAwarePolicy(config), PrefixAwarePolicy(config)
    pool_a, pool_b = workers(4), workers(4)
    warm = 2 * config.hot_window
    placed: dict[int, set[str]] = {}
    for router, pool, order in ((a, pool_a, interleaved_turns(rng, 60, 6)[1::2]),
                                (b, pool_b, interleaved_turns(rng, 60, 6)[::2])):
        for i, (conv, turn) in enumerate(order):
            decision = router.choose(chat_turn(conv, turn), pool)
            if i >= warm // 2:
                placed.setdefault(conv, set()).add(decision.worker.url)
    assert all(len(urls) == 1 for urls in placed.values())
    assert len(set().union(*placed.values())) == 4  # and the conversations spread


def test_routers_disagree_only_when_load_overflows_a_home():
    # Loads are each router's own: a router whose view of a worker is full walks on, the
    # other does not. The walk's order is shared, so an overflow goes to the same next
    # worker in every router that overflows.
    config = PrefixAwareConfig(balance=0.0, balance_abs=0, hot_window=0)
    a, b = PrefixAwarePolicy(config), PrefixAwarePolicy(config)
    pool_a, pool_b = workers(4), workers(4)
    home = a.choose(tenant_prompt(1, 0), pool_a).worker.url
    assert b.choose(tenant_prompt(1, 0), pool_b).worker.url == home
    next(w for w in pool_a if w.url == home).num_outstanding = 3
    overflow = a.choose(tenant_prompt(1, 1), pool_a)
    assert overflow.reason == "overflow" and overflow.worker.url != home
    assert b.choose(tenant_prompt(1, 1), pool_b).worker.url == home
    next(w for w in pool_b if w.url == home).num_outstanding = 3
    assert b.choose(tenant_prompt(1, 2), pool_b).worker.url == overflow.worker.url
