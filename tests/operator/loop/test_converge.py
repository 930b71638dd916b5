"""The reconcile loop kopf runs per InferenceService: pokes coalesce, errors go to kopf or wait."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from frota.operator.loop import converge
from frota.operator.loop.apply import ApiError, classify
from frota.operator.loop.reconcile import Outcome
from frota.operator.loop.state import OperatorState
from frota.operator.settings import OperatorSettings

BODY = {"metadata": {"name": "tiny", "namespace": "default"}}
KEY = ("default", "tiny")


class Stopped:
    """Stands in for kopf's `stopped` flag of a daemon."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self) -> None:
        await self.event.wait()


class FakeReconciles:
    """Counts reconciles; each one runs until the test lets it finish."""

    def __init__(self, state: OperatorState) -> None:
        self.state = state
        self.started = asyncio.Queue[int]()
        self.finish = asyncio.Queue[Exception | None]()
        self.count = 0

    async def __call__(self, body: Any, state: OperatorState) -> Outcome:
        self.count += 1
        await self.started.put(self.count)
        error = await self.finish.get()
        if error is not None:
            raise error
        return Outcome(result="converged")


@pytest.fixture
def loop_parts(monkeypatch: pytest.MonkeyPatch) -> tuple[OperatorState, FakeReconciles, Stopped]:
    state = OperatorState(OperatorSettings())
    fake = FakeReconciles(state)
    monkeypatch.setattr(converge, "reconcile_once", fake)
    return state, fake, Stopped()


async def test_pokes_during_a_reconcile_make_exactly_one_more(loop_parts) -> None:
    state, fake, stopped = loop_parts
    task = asyncio.create_task(converge.run(BODY, state, logger=None, stopped=stopped))
    assert await fake.started.get() == 1  # a loop that starts reconciles at once
    for _ in range(50):
        state.poke(KEY)
    assert state.pending == 1
    await fake.finish.put(None)
    assert await fake.started.get() == 2
    await fake.finish.put(None)
    await asyncio.sleep(0.05)
    assert fake.count == 2 and state.pending == 0
    stopped.event.set()
    await asyncio.wait_for(task, 1)
    state.poke(KEY)  # no loop any more: nothing to wake
    assert state.pending == 0


async def test_a_transient_error_leaves_the_loop_for_kopf_to_retry(loop_parts) -> None:
    state, fake, stopped = loop_parts
    task = asyncio.create_task(converge.run(BODY, state, logger=None, stopped=stopped))
    await fake.started.get()
    await fake.finish.put(kopf.TemporaryError("409", delay=0.2))
    with pytest.raises(kopf.TemporaryError):
        await asyncio.wait_for(task, 1)
    assert state.pending == 1  # still wanted: kopf starts the loop again after the delay


async def test_a_permanent_error_waits_for_the_next_change(loop_parts) -> None:
    state, fake, stopped = loop_parts

    class Logger:
        def __init__(self) -> None:
            self.errors: list[str] = []

        def error(self, message: str) -> None:
            self.errors.append(message)

    logger = Logger()
    task = asyncio.create_task(converge.run(BODY, state, logger=logger, stopped=stopped))
    await fake.started.get()
    await fake.finish.put(kopf.PermanentError("422"))
    await asyncio.sleep(0.05)
    assert not task.done() and fake.count == 1 and state.pending == 0
    assert "waiting for the next change" in logger.errors[0]
    state.poke(KEY)
    assert await fake.started.get() == 2
    await fake.finish.put(None)
    stopped.event.set()
    await asyncio.wait_for(task, 1)


def test_api_failures_are_sorted_into_kopf_retries() -> None:
    assert isinstance(classify(ApiError(409, "conflict"), "PATCH x", retry_delay=0.5),
                      kopf.TemporaryError)
    assert classify(ApiError(503, "down"), "PATCH x", retry_delay=0.5).delay == 0.5
    assert isinstance(classify(ApiError(422, "invalid"), "PATCH x", retry_delay=0.5),
                      kopf.PermanentError)
    assert isinstance(classify(TimeoutError(), "GET x", retry_delay=0.5), kopf.TemporaryError)
