"""The metric names Frota's processes export, read from their real registries, and the metric
names a PromQL expression reads: what a panel or an alert on a name nobody exports fails on."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from frota.engine.outputs import EngineStats
from frota.operator.metrics import OperatorMetrics
from frota.router.disagg import DisaggMetrics
from frota.router.metrics import RouterMetrics
from frota.server.metrics import ServerMetrics

# What Prometheus adds to every target.
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count", "")}


def _names(registry: CollectorRegistry) -> set[str]:
    out: set[str] = set()
    for family in registry.collect():
        out.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
    return out


def exported_names() -> set[str]:
    """Every series name a router (with a prefill pool), a worker (with LoRA and MoE on) and
    the operator can export."""
    router = RouterMetrics()
    DisaggMetrics(router.registry)
    stats = EngineStats(num_running=1, num_waiting=0, num_kv_blocks_total=8,
                        num_kv_blocks_used=1, block_size=16, prefix_cache_queries=1,
                        prefix_cache_hits=0, expert_tokens={(0, 0): 1},
                        running_adapters=("a",), max_adapters=1)
    worker = ServerMetrics("m", lambda: stats)
    return (_names(router.registry) | _names(worker.registry)
            | _names(OperatorMetrics().registry) | SCRAPE_SERIES)


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, ranges, strings, and the
    label lists of by/without/on/ignoring taken out; function names are followed by "(")."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word, rest = match.group(), text[match.end():].lstrip()
        if word in _KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names
