"""Reading a Prometheus exposition text as the control planes do (the operator's
autoscaler, `frota up`'s idle scaler and `frota status`): by sample name, over every
label set, whether the labels tell workers, endpoints or router processes apart."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

#: Samples that are a point in time: over label sets the latest counts, not the sum.
TIMESTAMP_SUFFIX = "_timestamp_seconds"


def sample_totals(text: str) -> dict[str, float]:
    """{sample name: its values summed over label sets}, but a timestamp's latest (two
    router processes' last requests do not add up). A malformed text gives what parsed
    before the fault."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, value = sample.name, sample.value
                if name not in totals:
                    totals[name] = value
                elif name.endswith(TIMESTAMP_SUFFIX):
                    totals[name] = max(totals[name], value)
                else:
                    totals[name] += value
    except ValueError:
        pass
    return totals
