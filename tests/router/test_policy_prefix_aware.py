"""prefix-aware: longest remembered prefix wins, consistent hashing with bounded load."""

import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frota.router.health import Worker
from frota.router.policies import PrefixAwareConfig, PrefixAwarePolicy, RouteRequest
from frota.router.policies.prefix_aware import prefix_block_hashes


def prefix_aware(**settings: object) -> PrefixAwarePolicy:
    return PrefixAwarePolicy(PrefixAwareConfig(**settings))  # type: ignore[arg-type]


def chat(*contents: str) -> RouteRequest:
    messages = [{"role": "system" if i == 0 else "user", "content": c}
                for i, c in enumerate(contents)]
    return RouteRequest("/v1/chat/completions", json.dumps({"messages": messages}).encode())


@given(st.text(min_size=1), st.text())
def test_block_hashes_of_a_prefix_are_a_prefix_of_the_hashes(base, extra):
    hashes = prefix_block_hashes(base + extra, 8, 1000)
    whole_blocks = len(base.encode("utf-8", "surrogatepass")) // 8
    assert prefix_block_hashes(base, 8, 1000)[:whole_blocks] == hashes[:whole_blocks]


def test_block_hashes_are_capped_and_cover_a_short_prompt():
    assert len(prefix_block_hashes("x" * 10_000, 128, 4)) == 4
    assert len(prefix_block_hashes("short", 128, 4)) == 1
    assert prefix_block_hashes("", 128, 4) == []


def test_conversations_stick_to_the_worker_holding_their_history():
    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = prefix_aware(block_chars=16)
    system = "You are a helpful assistant who answers briefly. " * 3
    for conv in range(20):
        history = [system]
        first = policy.choose(chat(*history, f"conversation {conv} opens"), workers).worker
        for turn in range(5):
            history.append(f"conversation {conv} turn {turn} says something long enough")
            decision = policy.choose(chat(*history), workers)
            assert decision.worker is first
            assert decision.reason == "prefix_hit"


def test_unseen_prompts_spread_by_consistent_hashing():
    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = prefix_aware(block_chars=16)
    picks = Counter(policy.choose(chat(f"{i} document " * 10), workers).worker.url
                    for i in range(400))
    assert len(picks) == 4 and min(picks.values()) > 40


def test_a_hot_prefix_overflows_to_other_workers_within_the_load_bound():
    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = prefix_aware(block_chars=16, balance=0.25, balance_abs=0)
    reasons = Counter()
    for _ in range(40):  # 40 concurrent requests with the same prompt, none finishing
        decision = policy.choose(chat("the same hot system prompt " * 8), workers)
        decision.worker.num_outstanding += 1
        reasons[decision.reason] += 1
        bound = -(-1.25 * sum(w.num_outstanding for w in workers) // 4)
        assert max(w.num_outstanding for w in workers) <= max(bound, 1)
    # Overflows walk the ring in one order, so the prefix spreads over as few replicas as
    # the bound allows (each then caches it) rather than over all of them.
    loads = sorted(w.num_outstanding for w in workers)
    assert loads[-3] >= 8 and sum(loads) == 40
    assert reasons["overflow"] > 0 and reasons["prefix_hit"] > 0


def test_the_load_bound_allows_a_few_requests_over_the_least_loaded_at_low_load():
    # Two workers, a handful in flight, many tenants: the relative bound alone would send
    # this tenant's fifth request elsewhere (1.25 x 3 -> 4); the absolute slack keeps it
    # with its cache until its owner is balance_abs requests ahead of the least loaded.
    workers = [Worker(f"http://w{i}") for i in range(2)]
    policy = prefix_aware(block_chars=16, balance=0.25, balance_abs=4)
    for tenant in range(12):
        policy.choose(chat(f"tenant {tenant}'s own system prompt, long enough to follow " * 3,
                           "q"), workers)
    prompt = chat("this tenant's system prompt, long enough to be worth following " * 3, "q")
    owner = policy.choose(prompt, workers).worker
    other = next(w for w in workers if w is not owner)
    other.num_outstanding = 1
    taken = []
    for _ in range(6):
        decision = policy.choose(prompt, workers)
        decision.worker.num_outstanding += 1
        taken.append((decision.worker is owner, decision.reason))
    assert taken[:5] == [(True, "prefix_hit")] * 5  # up to 1 + 4 on the owner
    assert taken[5] == (False, "overflow")
    # Under load the relative bound governs: 1.25 x the fair share of 41 is 26.
    owner.num_outstanding, other.num_outstanding = 26, 14
    assert policy.choose(prompt, workers).reason == "overflow"
    owner.num_outstanding, other.num_outstanding = 25, 15
    assert policy.choose(prompt, workers).reason == "prefix_hit"


@pytest.mark.parametrize(("hot_window", "split"), [(64, [3, 5]), (0, [0, 8])])
def test_a_hot_prefix_spreads_under_the_relative_bound_even_at_low_load(
    hot_window: int, split: list[int]
) -> None:
    # One system prompt behind every request (one tenant, or one app): kept on its owner
    # up to the absolute slack, it would take all 8 requests in flight while the other
    # worker idles. More than a fair share of the recent traffic makes it hot, and a hot
    # prefix gets only the relative bound: 5 of 8 here, the rest on the next worker.
    # --prefix-hot-window 0 turns hotness off: the same traffic stays on the owner.
    workers = [Worker(f"http://w{i}") for i in range(2)]
    policy = prefix_aware(block_chars=16, balance=0.25, balance_abs=8,
                               hot_window=hot_window)
    system = "the one system prompt every request of this app starts with " * 4
    for q in range(8):
        policy.choose(chat(system, f"question {q}"), workers).worker.num_outstanding += 1
    assert sorted(w.num_outstanding for w in workers) == split


def test_overflows_of_one_prefix_go_to_the_same_worker_whatever_follows_it():
    # A tenant's prompts share a long system prompt and differ after it. While its owner
    # is full, every overflow should land on one other worker (which then caches the
    # prefix), not on a different worker per question.
    workers = [Worker(f"http://w{i}") for i in range(6)]
    policy = prefix_aware(block_chars=16, balance=0.0, balance_abs=0)
    system = "a hot tenant's long system prompt with many rules and examples " * 4
    owner = policy.choose(chat(system, "question 0"), workers).worker
    owner.num_outstanding = 10
    borrowed = {policy.choose(chat(system, f"question {q} asks something else"),
                              workers).worker.url for q in range(1, 30)}
    assert len(borrowed) == 1 and owner.url not in borrowed


def test_an_overflow_borrows_a_worker_without_moving_the_prefix():
    # The owner of a tenant's system prompt is full: one request goes elsewhere, and the
    # next one (once the owner has room) goes back to the owner, where the prefix is cached.
    workers = [Worker(f"http://w{i}") for i in range(2)]
    policy = prefix_aware(block_chars=16, balance=0.0, balance_abs=0)
    system = "tenant seven's long system prompt, with its rules and examples " * 4
    owner = policy.choose(chat(system, "question 0"), workers).worker
    other = next(w for w in workers if w is not owner)
    owner.num_outstanding = 3
    question = "question 1, long enough to fill whole blocks of its own"
    borrowed = policy.choose(chat(system, question), workers)
    assert (borrowed.worker, borrowed.reason) == (other, "overflow")
    owner.num_outstanding = 0
    again = policy.choose(chat(system, "question 2"), workers)
    assert (again.worker, again.reason) == (owner, "prefix_hit")
    # What only the borrowed worker saw (question 1's own blocks) is remembered there.
    follow_up = policy.choose(chat(system, question, "and a follow-up"), workers)
    assert (follow_up.worker, follow_up.reason) == (other, "prefix_hit")


def test_a_vanished_owner_is_replaced_without_error():
    workers = [Worker(f"http://w{i}") for i in range(3)]
    policy = prefix_aware(block_chars=16)
    prompt = chat("long shared prefix " * 10)
    owner = policy.choose(prompt, workers).worker
    rest = [w for w in workers if w is not owner]
    new_owner = policy.choose(prompt, rest).worker
    assert new_owner in rest
    assert policy.choose(prompt, rest).worker is new_owner


def test_the_prefix_table_is_bounded():
    workers = [Worker("http://w0")]
    policy = prefix_aware(block_chars=4, max_table_entries=100)
    for i in range(500):
        policy.choose(chat(f"prompt number {i}"), workers)
    assert len(policy._owner) <= 100


def test_completions_prompts_hash_like_chat_text():
    request = RouteRequest("/v1/completions", json.dumps({"prompt": ["abc", "def"]}).encode())
    assert request.prompt_text == "abc"
    assert RouteRequest("/v1/completions", b'{"prompt": [1, 2]}').prompt_text == "1 2"
    assert RouteRequest("/v1/completions", b"not json").prompt_text == ""


def test_a_short_shared_prefix_does_not_pile_first_turns_onto_one_worker():
    # Every conversation opens with the same short system prompt: following it would send
    # all first turns to its owner. Below min_match they go to the least loaded worker,
    # and each conversation's later turns (mostly its own history) follow its first.
    workers = [Worker(f"http://w{i}") for i in range(2)]
    policy = prefix_aware(block_chars=16, balance=10.0, min_match=0.5)
    system = "Be terse. " * 4  # 40 characters, shorter than each user message
    firsts = {}
    for conv in range(8):  # all in flight at once
        decision = policy.choose(chat(system, f"{conv}: this conversation asks something rather long about the fleet"),
                                 workers)
        decision.worker.num_outstanding += 1
        firsts[conv] = decision.worker
    assert [w.num_outstanding for w in workers] == [4, 4]
    for conv in range(8):
        later = chat(system, f"{conv}: this conversation asks something rather long about the fleet", "and then more")
        decision = policy.choose(later, workers)
        assert decision.worker is firsts[conv] and decision.reason == "prefix_hit"


def test_min_match_zero_follows_any_remembered_prefix():
    workers = [Worker(f"http://w{i}") for i in range(2)]
    policy = prefix_aware(block_chars=16, balance=10.0, min_match=0.0)
    system = "Be terse. " * 4
    picks = set()
    for conv in range(8):
        decision = policy.choose(chat(system, f"{conv}: this conversation asks something rather long about the fleet"),
                                 workers)
        decision.worker.num_outstanding += 1
        picks.add(decision.worker.url)
    assert len(picks) == 1  # the shared system prompt's owner takes them all


def test_prefix_aware_options_are_checked():
    for kwargs in ({"min_match": 1.5}, {"balance": -1}, {"block_chars": 0}, {"balance_abs": -1},
                   {"hot_window": -1}):
        with pytest.raises(ValueError, match="--prefix-"):
            prefix_aware(**kwargs)

