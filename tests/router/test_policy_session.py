"""session: affinity by header or `user`, consistent hashing over healthy workers."""

import json
from collections import Counter

from frota.router.health import Worker
from frota.router.policies import RouteRequest, SessionPolicy


def req(user=None, header=None):
    body = json.dumps({"prompt": "hi", **({"user": user} if user else {})}).encode()
    return RouteRequest("/v1/completions", body, {"x-session-id": header} if header else {})


def test_same_session_always_reaches_the_same_worker():
    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = SessionPolicy()
    for key in ("alice", "bob", "carol"):
        picks = {policy.choose(req(user=key), workers).worker.url for _ in range(20)}
        assert len(picks) == 1
    decision = policy.choose(req(header="s-1"), workers)
    assert decision.reason == "affinity"


def test_header_wins_over_user_field():
    workers = [Worker(f"http://w{i}") for i in range(8)]
    policy = SessionPolicy()
    by_header = policy.choose(req(header="h"), workers).worker
    assert all(policy.choose(req(user=f"u{i}", header="h"), workers).worker is by_header
               for i in range(10))


def test_sessions_spread_and_only_a_lost_workers_sessions_move():
    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = SessionPolicy()
    before = {f"u{i}": policy.choose(req(user=f"u{i}"), workers).worker.url for i in range(400)}
    assert min(Counter(before.values()).values()) > 40  # every worker gets a share
    survivors = workers[1:]
    after = {k: policy.choose(req(user=k), survivors).worker.url for k in before}
    moved = [k for k in before if before[k] != after[k]]
    assert all(before[k] == workers[0].url for k in moved)


def test_requests_without_a_session_go_to_the_least_loaded_worker():
    a, b = Worker("http://a", num_outstanding=3), Worker("http://b", num_outstanding=0)
    decision = SessionPolicy().choose(req(), [a, b])
    assert decision.worker is b and decision.reason == "no_session"
