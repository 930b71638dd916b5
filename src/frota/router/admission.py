"""Admission control: a global in-flight limit and a bounded, timed, prioritized queue."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time

from frota.api.contract import AdmissionDefault
from frota.router.metrics import RouterMetrics


class Rejected(Exception):
    """A request admission refused; the app answers 429 with `Retry-After`."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class AdmissionController:
    """At most `max_inflight` requests run; up to `max_queue` more wait, each at most
    `queue_timeout` seconds; beyond that a request is rejected at once.

    Waiters are served by priority (higher first), then in arrival order. A slot
    freed by `release` passes straight to the next waiter, so a burst of new
    arrivals cannot overtake the queue. `max_inflight=0` disables the limit.
    """

    def __init__(self, metrics: RouterMetrics, *,
                 max_inflight: int = AdmissionDefault.MAX_INFLIGHT,
                 max_queue: int = AdmissionDefault.MAX_QUEUE,
                 queue_timeout: float = AdmissionDefault.QUEUE_TIMEOUT_S,
                 retry_after: int = 1) -> None:
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.retry_after = retry_after
        self.num_inflight = 0
        self._metrics = metrics
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._num_waiting = 0
        self._seq = itertools.count()
        # Both gauges read these counts when scraped (updating them cost two calls a request).
        metrics.inflight.add_reader(lambda: [((), self.num_inflight)])
        metrics.queue_depth.add_reader(lambda: [((), self._num_waiting)])

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits for it (no waiting: the router's
        usual case, without the cost of a coroutine); else False, and `acquire` waits."""
        if not self.max_inflight or (self.num_inflight < self.max_inflight
                                     and not self._num_waiting):
            self.num_inflight += 1
            return True
        return False

    async def acquire(self, priority: int = 0) -> None:
        """Wait for a slot; raise `Rejected` when the queue is full or the wait times out."""
        if self.try_acquire():
            return
        if self._num_waiting >= self.max_queue:
            self._metrics.rejections.labels("queue_full").inc()
            raise Rejected("queue_full", self.retry_after)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (-priority, next(self._seq), future))
        self._num_waiting += 1
        started = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(future), self.queue_timeout)
        except TimeoutError:
            if not future.done():
                future.cancel()
                self._forget()
                self._metrics.rejections.labels("queue_timeout").inc()
                raise Rejected("queue_timeout", self.retry_after) from None
            # The slot arrived as the timer fired: keep it.
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # we were handed a slot but the client left: pass it on
            else:
                future.cancel()
                self._forget()
            raise
        finally:
            self._metrics.queue_wait.observe(time.monotonic() - started)

    def _forget(self) -> None:
        self._num_waiting -= 1
        # Timed-out waiters stay in the heap until popped; with no releases coming
        # (every slot stuck) they would pile up, so compact now and then.
        if len(self._waiters) > 2 * self._num_waiting + 64:
            self._waiters = [w for w in self._waiters if not w[2].cancelled()]
            heapq.heapify(self._waiters)

    def release(self) -> None:
        """Free a slot: hand it to the best waiter, or give it back."""
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if future.cancelled():
                continue  # already forgotten by its waiter
            self._forget()
            future.set_result(None)  # the slot moves to the waiter; inflight is unchanged
            return
        self.num_inflight -= 1


def process_share(limit: int, num_processes: int, index: int) -> int:
    """Process `index`'s part of a limit that `num_processes` router processes enforce
    together, each with its own count: the parts sum to `limit`, as even as whole
    numbers allow. A limit of 0 stays 0 (for `max_inflight`: unlimited). A positive
    limit smaller than the number of processes still gives each process one, since 0
    would lift `max_inflight` altogether: the pod then admits up to `num_processes`."""
    if limit <= 0 or num_processes <= 1:
        return limit
    part, extra = divmod(limit, num_processes)
    return max(1, part + (index < extra))
