"""prefix-aware: the shortest prefix that is not hot places a request, by consistent hashing
with bounded load."""

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


def test_conversations_stick_to_one_worker_once_their_shared_system_prompt_is_hot():
    # Every conversation opens with the same system prompt: once it is hot (more of the
    # window than one worker may take), each conversation is placed by its own first
    # message, which every later turn repeats, so all its turns meet on one worker.
    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = prefix_aware(block_chars=16, hot_window=64)
    system = "You are a helpful assistant who answers briefly. " * 3
    for warm in range(64):  # the window full: the system prompt is all the traffic
        policy.choose(chat(system, f"warm-up conversation {warm} opens"), workers)
    firsts = set()
    for conv in range(20):
        history = [system, f"conversation {conv} opens with a question"]
        first = policy.choose(chat(*history), workers)
        assert first.reason == "spread"
        firsts.add(first.worker.url)
        for turn in range(5):
            history.append(f"conversation {conv} turn {turn} says something long enough")
            decision = policy.choose(chat(*history), workers)
            assert (decision.worker, decision.reason) == (first.worker, "spread")
    assert len(firsts) == 4


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
    assert sum(w.num_outstanding for w in workers) == 40
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


@pytest.mark.parametrize(("hot_window", "num_workers_used"), [(16, 2), (0, 1)])
def test_a_hot_prefix_spreads_over_the_workers_its_share_needs(
    hot_window: int, num_workers_used: int
) -> None:
    # One system prompt behind every request (one tenant, or one app): kept on its home
    # up to the absolute slack, it would take every request while the other workers
    # idle. More of the window than one worker may take under the load bound makes it
    # hot, and then each request is placed by its own question among the workers that
    # share needs: two of four when the prompt is half the traffic (0.5 x 4 / 1.25).
    # --prefix-hot-window 0 turns hotness off.
    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = prefix_aware(block_chars=16, balance=0.25, balance_abs=100,
                          hot_window=hot_window)
    system = "the one system prompt every request of this app starts with " * 4
    used = Counter()
    for q in range(200):
        used[policy.choose(chat(system, f"question {q}"), workers).worker.url] += q >= 100
        policy.choose(chat(f"another tenant {q}'s prompt, different from the first block"),
                      workers)
    used = +used  # the last 100, with the window full
    assert len(used) == num_workers_used and min(used.values()) >= 25


def test_overflows_of_one_prefix_go_to_the_same_worker_whatever_follows_it():
    # A tenant's prompts share a long system prompt and differ after it. While its owner
    # is full, every overflow should land on one other worker (which then caches the
    # prefix), not on a different worker per question.
    workers = [Worker(f"http://w{i}") for i in range(6)]
    policy = prefix_aware(block_chars=16, balance=0.0, balance_abs=0, hot_window=0)
    system = "a busy tenant's long system prompt with many rules and examples " * 4
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


def test_a_vanished_owner_is_replaced_without_error():
    workers = [Worker(f"http://w{i}") for i in range(3)]
    policy = prefix_aware(block_chars=16)
    prompt = chat("long shared prefix " * 10)
    owner = policy.choose(prompt, workers).worker
    rest = [w for w in workers if w is not owner]
    new_owner = policy.choose(prompt, rest).worker
    assert new_owner in rest
    assert policy.choose(prompt, rest).worker is new_owner
    assert policy.choose(prompt, workers).worker is owner  # back when it is


def test_the_hot_window_forgets_what_left_it():
    workers = [Worker("http://w0"), Worker("http://w1")]
    policy = prefix_aware(block_chars=4, hot_window=10)
    for i in range(500):
        policy.choose(chat(f"prompt number {i}"), workers)
    assert len(policy._recent) == 10
    assert sum(policy._recent_counts.values()) == sum(len(k) for k in policy._recent)


def test_completions_prompts_hash_like_chat_text():
    request = RouteRequest("/v1/completions", json.dumps({"prompt": ["abc", "def"]}).encode())
    assert request.prompt_text == "abc"
    assert RouteRequest("/v1/completions", b'{"prompt": [1, 2]}').prompt_text == "1 2"
    assert RouteRequest("/v1/completions", b"not json").prompt_text == ""


def test_a_short_shared_prefix_does_not_pile_first_turns_onto_one_worker():
    # Every conversation opens with the same short system prompt. Once it is hot, first
    # turns are placed by their own message and spread; each conversation's later turns
    # (mostly its own history) follow its first.
    workers = [Worker(f"http://w{i}") for i in range(2)]
    policy = prefix_aware(block_chars=16, balance=0.25, balance_abs=100, hot_window=4)
    system = "Be terse. " * 4  # 40 characters, shorter than each user message
    for warm in range(4):
        policy.choose(chat(system, f"warm-up {warm}: something long enough to be a block"),
                      workers)
    firsts = {}
    for conv in range(16):
        opening = f"{conv}: this conversation asks something rather long about the fleet"
        firsts[conv] = policy.choose(chat(system, opening), workers).worker
    assert len(set(firsts.values())) == 2
    for conv in range(16):
        opening = f"{conv}: this conversation asks something rather long about the fleet"
        decision = policy.choose(chat(system, opening, "and then more"), workers)
        assert decision.worker is firsts[conv] and decision.reason == "spread"


def test_prefix_aware_options_are_checked():
    for kwargs in ({"balance": -1}, {"block_chars": 0}, {"balance_abs": -1},
                   {"hot_window": -1}):
        with pytest.raises(ValueError, match="--prefix-"):
            prefix_aware(**kwargs)

