"""The autoscaler's decision: recommend from the router's metrics, stabilize before scaling down."""

from __future__ import annotations

from frota.operator.autoscale import Bounds, History, decide, per_replica_value, recommend

BOUNDS = Bounds(min_replicas=1, max_replicas=8, target=4.0, stabilization_seconds=300)


def metrics(queue: float, outstanding: dict[str, float], ttft_sum: float = 0.0,
            ttft_count: float = 0.0) -> str:
    lines = ["# TYPE frota_router_queue_depth gauge", f"frota_router_queue_depth {queue}",
             "# TYPE frota_router_worker_outstanding_requests gauge"]
    lines += [f'frota_router_worker_outstanding_requests{{worker="{w}"}} {v}'
              for w, v in outstanding.items()]
    lines += ["# TYPE frota_router_time_to_first_token_seconds histogram",
              f'frota_router_time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft_count}',
              f"frota_router_time_to_first_token_seconds_sum {ttft_sum}",
              f"frota_router_time_to_first_token_seconds_count {ttft_count}"]
    return "\n".join(lines) + "\n"


def test_queue_depth_is_waiting_plus_in_flight_per_replica() -> None:
    text = metrics(4, {"a": 6, "b": 6})
    assert per_replica_value(text, "queueDepth", 2, History()) == 8.0


def test_ttft_is_the_mean_of_first_tokens_since_the_last_tick() -> None:
    history = History()
    assert per_replica_value(metrics(0, {}, 10.0, 10), "ttft", 2, history) is None
    assert per_replica_value(metrics(0, {}, 16.0, 13), "ttft", 2, history) == 2.0
    assert per_replica_value(metrics(0, {}, 16.0, 13), "ttft", 2, history) is None


def test_recommendation_scales_in_proportion_within_bounds() -> None:
    assert recommend(2, 8.0, BOUNDS) == 4
    assert recommend(2, 100.0, BOUNDS) == 8
    assert recommend(4, 0.0, BOUNDS) == 1
    assert recommend(2, 4.2, BOUNDS) == 2  # within tolerance
    assert recommend(2, None, BOUNDS) == 2


def test_scale_up_is_immediate_and_scale_down_waits_for_the_window() -> None:
    history = History()
    assert decide(2, 4, history, BOUNDS, now=0.0) == 4
    assert decide(4, 1, history, BOUNDS, now=60.0) == 4  # 4 was recommended 60 s ago
    assert decide(4, 1, history, BOUNDS, now=200.0) == 4
    assert decide(4, 1, history, BOUNDS, now=301.0) == 1  # the 4 left the window


def test_scale_down_goes_to_the_highest_recent_recommendation() -> None:
    history = History()
    decide(6, 6, history, BOUNDS, now=0.0)
    decide(6, 3, history, BOUNDS, now=100.0)
    assert decide(6, 2, history, BOUNDS, now=350.0) == 3
