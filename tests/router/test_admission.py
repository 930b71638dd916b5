"""Admission: in-flight limit, bounded queue with timeout, priorities."""

import asyncio

import pytest

from frota.router.admission import AdmissionController, Rejected
from frota.router.metrics import RouterMetrics


def controller(**kwargs) -> AdmissionController:
    return AdmissionController(RouterMetrics(), **kwargs)


async def test_requests_within_the_limit_are_admitted_at_once():
    adm = controller(max_inflight=2, max_queue=0)
    await adm.acquire()
    await adm.acquire()
    assert adm.num_inflight == 2


async def test_a_full_queue_rejects_immediately():
    adm = controller(max_inflight=1, max_queue=1, queue_timeout=10)
    await adm.acquire()
    waiter = asyncio.create_task(adm.acquire())
    await asyncio.sleep(0)
    with pytest.raises(Rejected) as exc:
        await asyncio.wait_for(adm.acquire(), 1)
    assert exc.value.reason == "queue_full" and exc.value.retry_after >= 1
    adm.release()
    await waiter
    assert adm.num_inflight == 1 and adm.num_waiting == 0


async def test_the_gauges_read_the_counts_in_flight_and_waiting():
    metrics = RouterMetrics()
    adm = AdmissionController(metrics, max_inflight=1, max_queue=4, queue_timeout=10)

    def gauges() -> tuple[float, float]:
        samples = {s.name: s.value for family in metrics.registry.collect()
                   for s in family.samples}
        return samples["frota_router_inflight_requests"], samples["frota_router_queue_depth"]

    assert gauges() == (0, 0)
    await adm.acquire()
    waiters = [asyncio.create_task(adm.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert gauges() == (1, 2)
    adm.release()  # the slot passes to a waiter
    await asyncio.sleep(0)
    assert gauges() == (1, 1)
    waiters[1].cancel()  # a waiting client leaves
    await asyncio.gather(*waiters, return_exceptions=True)
    assert gauges() == (1, 0)
    adm.release()
    assert gauges() == (0, 0)


async def test_a_queued_request_times_out_with_rejection():
    adm = controller(max_inflight=1, max_queue=4, queue_timeout=0.05)
    await adm.acquire()
    with pytest.raises(Rejected) as exc:
        await adm.acquire()
    assert exc.value.reason == "queue_timeout"
    assert adm.num_waiting == 0
    adm.release()
    assert adm.num_inflight == 0


async def test_released_slots_go_to_higher_priority_first_then_fifo():
    adm = controller(max_inflight=1, max_queue=10, queue_timeout=5)
    await adm.acquire()
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        await adm.acquire(priority)
        order.append(name)

    tasks = [asyncio.create_task(wait(n, p)) for n, p in
             [("low1", 0), ("high", 5), ("low2", 0)]]
    await asyncio.sleep(0.01)
    for _ in range(3):
        adm.release()
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert order == ["high", "low1", "low2"]


async def test_a_cancelled_waiter_does_not_leak_its_slot():
    adm = controller(max_inflight=1, max_queue=10, queue_timeout=5)
    await adm.acquire()
    gone = asyncio.create_task(adm.acquire())
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert adm.num_waiting == 0
    adm.release()
    assert adm.num_inflight == 0
    await asyncio.wait_for(adm.acquire(), 1)


async def test_zero_means_unlimited():
    adm = controller(max_inflight=0, max_queue=0)
    for _ in range(1000):
        await adm.acquire()
    assert adm.num_inflight == 1000


async def test_timed_out_waiters_do_not_pile_up_while_slots_are_stuck():
    adm = controller(max_inflight=1, max_queue=2, queue_timeout=0.001)
    await adm.acquire()  # never released
    for _ in range(150):
        with pytest.raises(Rejected):
            await adm.acquire()
    assert len(adm._waiters) <= 2 * adm.max_queue + 64 < 150
