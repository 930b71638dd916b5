"""Reading a Prometheus text exposition (a /metrics page) in tests and in bench/, with
prometheus_client's own parser, as the operator and `frota up` read it."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str) -> Iterator[Sample]:
    """Every sample in `text` (a counter's is named with its `_total`)."""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
    return sum((s.value for s in samples(text)
                if s.name == name and labels.items() <= s.labels.items()), 0.0)


def prefix_cache_counters(text: str) -> tuple[float, float]:
    """vLLM's prefix-cache counters in `text`: (hits, queries), in tokens. A counter's
    sample ends in `_total`; a bare name (an exposition without TYPE lines) counts too."""
    hits, queries = (metric_sum(text, name) + metric_sum(text, name + "_total")
                     for name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"))
    return hits, queries
