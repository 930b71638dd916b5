"""round-robin: an even cycle over the candidates."""

from collections import Counter

from frota.router.health import Worker
from frota.router.policies import RoundRobinPolicy, RouteRequest


def test_round_robin_cycles_evenly_over_workers():
    workers = [Worker(f"http://w{i}") for i in range(3)]
    policy = RoundRobinPolicy()
    picks = Counter(policy.choose(RouteRequest("/v1/completions", b"{}"), workers).worker.url
                    for _ in range(300))
    assert picks == {w.url: 100 for w in workers}


def test_round_robin_skips_excluded_workers_without_stalling():
    workers = [Worker(f"http://w{i}") for i in range(3)]
    policy = RoundRobinPolicy()
    picks = {policy.choose(RouteRequest("/", b""), workers[1:]).worker.url for _ in range(4)}
    assert picks == {"http://w1", "http://w2"}
