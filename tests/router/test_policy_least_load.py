"""least-load: outstanding requests or the workers' scraped vLLM gauges."""

import time
from collections import Counter

from frota.router.health import Worker, WorkerLoad
from frota.router.policies import LeastLoadPolicy, LoadSignal, RouteRequest

REQ = RouteRequest("/v1/completions", b"{}")


def test_least_outstanding_picks_the_idlest_worker():
    a, b, c = Worker("http://a", num_outstanding=5), Worker("http://b", num_outstanding=1), \
        Worker("http://c", num_outstanding=3)
    decision = LeastLoadPolicy().choose(REQ, [a, b, c])
    assert decision.worker is b
    assert decision.reason == "least_outstanding"


def test_ties_are_spread_round_robin():
    workers = [Worker(f"http://w{i}") for i in range(3)]
    policy = LeastLoadPolicy()
    picks = Counter(policy.choose(REQ, workers).worker.url for _ in range(30))
    assert picks == {w.url: 10 for w in workers}


def test_metrics_signal_prefers_fewer_waiting_then_lower_kv_usage():
    now = time.monotonic()
    busy = Worker("http://busy", load=WorkerLoad(num_waiting=8, num_running=4, scraped_at=now))
    full = Worker("http://full", load=WorkerLoad(num_running=2, kv_usage=0.9, scraped_at=now))
    free = Worker("http://free", load=WorkerLoad(num_running=2, kv_usage=0.1, scraped_at=now))
    policy = LeastLoadPolicy(LoadSignal.METRICS)
    assert policy.needs_worker_metrics
    assert policy.choose(REQ, [busy, full, free]).worker is free


def test_metrics_signal_counts_router_inflight_between_scrapes():
    now = time.monotonic()
    # Scraped idle, but this router has since sent it 5 requests: not the idlest any more.
    a = Worker("http://a", num_outstanding=5, load=WorkerLoad(scraped_at=now))
    b = Worker("http://b", num_outstanding=0, load=WorkerLoad(num_running=2, scraped_at=now))
    assert LeastLoadPolicy(LoadSignal.METRICS).choose(REQ, [a, b]).worker is b


def test_stale_scrapes_fall_back_to_outstanding():
    old = time.monotonic() - 60
    a = Worker("http://a", num_outstanding=0, load=WorkerLoad(num_waiting=50, scraped_at=old))
    b = Worker("http://b", num_outstanding=2, load=WorkerLoad(scraped_at=old))
    assert LeastLoadPolicy(LoadSignal.METRICS).choose(REQ, [a, b]).worker is a
