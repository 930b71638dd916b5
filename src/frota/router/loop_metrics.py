"""Counters, gauges and histograms for code that runs on one event loop: the router's.

The router counts every request several times over (its endpoint and status, the
routing decision, the worker's outstanding requests, two latency histograms).
prometheus_client takes a lock for each update, builds and checks a label tuple for
each `labels()` call, and walks a histogram's buckets in Python: measured with
callgrind on the router's process (docs/benchmarks.md, "Overhead"), its metrics were
93k of the 352k instructions the router spent on a non-streaming request, a quarter
of it. Here an update is an addition to a slot of an object found by one dictionary
lookup, and an observation is one bisect.

Nothing is locked: the router updates its metrics and renders them (`/metrics`) on
the same event loop, so no update can interleave with another or with a scrape. Do
not update these from another thread.

They render through prometheus_client's exposition (`generate_latest`) as its own
`Counter`, `Gauge` and `Histogram` of the same name, labels and buckets would, with
their `_created` samples, so a scrape cannot tell them apart (tests/router/test_metrics.py).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class CounterValue:
    """One counter series."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class GaugeValue:
    """One gauge series."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def set_to_current_time(self) -> None:
        self.value = time.time()


class HistogramValue:
    """One histogram series: a count per bucket (the last: above every bound) and a sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # `le`: the first bound >= value
        self.sum += value


V = TypeVar("V", CounterValue, GaugeValue, HistogramValue)


class _Family(Collector, Generic[V]):
    """A metric and its series by label values; registered on `registry` at once.

    `labels(*values)` returns the series of those values (made on first use); a family
    without labels has one series, which its own `inc`, `set`, `observe`... update."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], V] = {}
        registry.register(self)

    def _new(self) -> V:
        raise NotImplementedError

    def labels(self, *values: str) -> V:
        try:
            return self._series[values]
        except KeyError:
            return self._add(values)

    def _add(self, values: tuple[object, ...]) -> V:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values!r}")
        key = tuple(str(v) for v in values)  # a value not given as str: a lookup each time
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new()
        return series

    def remove(self, *values: str) -> None:
        """Forget the series of these label values (a worker that left)."""
        self._series.pop(tuple(str(v) for v in values), None)

    def describe(self) -> Iterable[Metric]:
        """What the registry checks names with (a name taken twice is refused)."""
        return self.collect()

    def _items(self) -> Iterable[tuple[list[str], V]]:
        return ((list(key), series) for key, series in list(self._series.items()))


class Counter(_Family[CounterValue]):
    """Rendered as prometheus_client's `Counter`: `<name>_total` and `<name>_created`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames,
                         registry=registry)
        if not self.labelnames:
            self.inc = self.labels().inc

    def _new(self) -> CounterValue:
        return CounterValue()

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in self._items():
            family.add_metric(values, series.value, created=series.created)
        return [family]


class Gauge(_Family[GaugeValue]):
    """Rendered as prometheus_client's `Gauge`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, labelnames, registry=registry)
        if not self.labelnames:
            series = self.labels()
            self.inc, self.dec, self.set = series.inc, series.dec, series.set
            self.set_to_current_time = series.set_to_current_time

    def _new(self) -> GaugeValue:
        return GaugeValue()

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in self._items():
            family.add_metric(values, series.value)
        return [family]


Reader = Callable[[], Iterable[tuple[Sequence[str], float]]]


class ReadGauge(Collector):
    """A gauge read when scraped: each of its readers (`add_reader`) gives series, as
    (label values, value) pairs; a series two readers give shows their sum. For a count
    its owner keeps anyway, which a gauge would copy on every change (a worker's requests
    in flight: two updates and a series lookup per request). Rendered as
    prometheus_client's `Gauge`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._readers: list[Reader] = []
        registry.register(self)

    def add_reader(self, read: Reader) -> None:
        self._readers.append(read)

    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        series: dict[tuple[str, ...], float] = {}
        for read in self._readers:
            for values, value in read():
                key = tuple(values)
                series[key] = series.get(key, 0.0) + value
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, value in series.items():
            family.add_metric(list(key), value)
        return [family]


class Histogram(_Family[HistogramValue]):
    """Rendered as prometheus_client's `Histogram` with these `buckets`: `_bucket` (with
    `+Inf`), `_count`, `_sum` and `_created`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.bounds = tuple(sorted(float(b) for b in buckets if b != math.inf))
        self._bucket_names = [floatToGoString(b) for b in (*self.bounds, math.inf)]
        super().__init__(name, documentation, labelnames, registry=registry)
        if not self.labelnames:
            self.observe = self.labels().observe

    def _new(self) -> HistogramValue:
        return HistogramValue(self.bounds)

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in self._items():
            cumulative = accumulate(series.counts)
            family.add_metric(values, list(zip(self._bucket_names, cumulative, strict=True)),
                              series.sum)
            family.samples.append(Sample(f"{self.name}_created",
                                         dict(zip(self.labelnames, values, strict=True)),
                                         series.created, None, None))
        return [family]
