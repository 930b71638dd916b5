"""Pure helpers of the reconciler: field containment and the applied-writes memory."""

from __future__ import annotations

from frota.operator.loop.children import Applied
from frota.operator.loop.reconcile import contains

SVC = {"kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}


def test_contains_allows_server_defaults_but_not_changes() -> None:
    seen = {"kind": "Service", "metadata": {"name": "s", "uid": "u"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}}
    assert contains(seen, SVC)
    assert not contains({**seen, "spec": {"ports": [{"port": 81}]}}, SVC)
    assert not contains({**seen, "spec": {"ports": []}}, SVC)
    assert not contains(None, SVC)


def test_applied_covers_only_until_the_cache_catches_up() -> None:
    applied = Applied(window_seconds=30)
    applied.record(SVC, {"metadata": {"resourceVersion": "10"}}, "ns", now=0.0)
    assert applied.covers(SVC, None, "ns", now=1.0)  # not in the cache yet
    assert applied.covers(SVC, {"metadata": {"resourceVersion": "9"}}, "ns", now=1.0)  # older
    assert not applied.covers(SVC, {"metadata": {"resourceVersion": "10"}}, "ns", now=1.0)
    assert not applied.covers(SVC, None, "ns", now=2.0)  # the record is gone: deleted -> apply


def test_applied_never_covers_other_content_or_old_writes() -> None:
    applied = Applied(window_seconds=30)
    applied.record(SVC, {"metadata": {"resourceVersion": "10"}}, "ns", now=0.0)
    changed = {**SVC, "spec": {"ports": [{"port": 81}]}}
    assert not applied.covers(changed, None, "ns", now=1.0)
    assert not applied.covers(SVC, None, "ns", now=31.0)
    applied.record(SVC, {"metadata": {"resourceVersion": "11"}}, "ns", now=40.0)
    applied.confirm(SVC, "ns")
    assert not applied.covers(SVC, None, "ns", now=41.0)
