"""Scale to zero's fast path: a new stamp in a fleet's demand ConfigMap brings it back at once,
and nothing else does (an old stamp, another fleet's name, a ConfigMap that is not its own)."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest

from frota.api.contract import Demand
from frota.operator.loop import handlers
from frota.operator.loop.state import OperatorState
from frota.operator.scaling import autoscaler, demand
from tests.isvc_fixtures import Spec

SCALE_TO_ZERO = {"minReplicas": 0, "maxReplicas": 2, "target": 4, "scaleToZero": {}}


def configmap(fleet: str = "tiny", *, name: str | None = None, stamp: str | None = None,
              namespace: str = "llm") -> dict[str, Any]:
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name or fleet + Demand.CONFIGMAP_SUFFIX, "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "frota", "app.kubernetes.io/instance": fleet,
                   "app.kubernetes.io/component": Demand.COMPONENT}}}
    if stamp is not None:
        cm["data"] = {Demand.DATA_KEY: stamp}
    return cm


def test_a_new_stamp_is_news_and_the_same_stamp_again_is_not():
    seen: dict = {}
    assert demand.news(configmap(), seen) is None  # made by the operator, not stamped yet
    assert demand.news(configmap(stamp="2026-12-03T12:00:00.000001Z"), seen) == ("llm", "tiny")
    assert demand.news(configmap(stamp="2026-12-03T12:00:00.000001Z"), seen) is None
    assert demand.news(configmap(stamp="2026-12-03T12:00:02.000001Z"), seen) == ("llm", "tiny")


def test_the_stamp_found_in_the_listing_at_start_up_wakes_nothing():
    # An old stamp must not bring back a fleet that went idle since; the autoscaling tick
    # sees requests held while the operator was away.
    seen: dict = {}
    assert demand.news(configmap(stamp="2026-12-01T00:00:00Z"), seen, listing=True) is None
    assert demand.news(configmap(stamp="2026-12-03T12:00:00Z"), seen) == ("llm", "tiny")
    # A later listing (a watch started again) compares with what was seen.
    assert demand.news(configmap(stamp="2026-12-03T12:00:09Z"), seen, listing=True) == ("llm", "tiny")


def test_a_stamp_first_seen_in_an_event_is_news():
    # kopf folds close events of one object: the creation and the first stamp may be one.
    assert demand.news(configmap(stamp="2026-12-03T12:00:00Z"), {}) == ("llm", "tiny")


def test_a_configmap_relabelled_to_name_another_fleet_wakes_no_fleet():
    # A router may patch its own demand ConfigMap, labels included: naming another fleet
    # in them must not let it wake that fleet.
    seen: dict = {}
    forged = configmap("other", name="tiny" + Demand.CONFIGMAP_SUFFIX)
    assert demand.news(forged, seen) is None
    assert demand.news({**forged, "data": {Demand.DATA_KEY: "2026-12-03T12:00:00Z"}}, seen) is None
    assert seen == {}


def test_fleets_are_told_apart_by_namespace():
    seen: dict = {}
    for namespace in ("team-a", "team-b"):
        demand.news(configmap(namespace=namespace), seen)
    assert demand.news(configmap(namespace="team-b", stamp="2026-12-03T12:00:00Z"),
                       seen) == ("team-b", "tiny")


class FakeKube:
    def __init__(self, owner: dict[str, Any] | None) -> None:
        self.owner = owner
        self.gets: list[tuple[str, str, str]] = []
        self.scaled: list[tuple[str, str, int]] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets.append((kind, namespace, name))
        return self.owner

    async def patch_spec_replicas(self, namespace: str, name: str, replicas: int) -> None:
        self.scaled.append((namespace, name, replicas))


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch) -> OperatorState:
    monkeypatch.setattr(autoscaler.kopf, "event", lambda *a, **k: None)
    return OperatorState()


def owner(replicas: int) -> dict[str, Any]:
    manifest = Spec().set("spec.autoscaling", SCALE_TO_ZERO).replicas(replicas).manifest()
    manifest["metadata"].update(generation=1)
    return manifest


async def signal(state: OperatorState, cm: dict[str, Any], type_: str | None = "MODIFIED") -> None:
    await handlers.demand_signalled(body=kopf.Body(cm), type=type_, memo=kopf.Memo(state=state),
                                    logger=logging.getLogger("test"))


async def test_a_new_stamp_brings_a_fleet_at_zero_back_with_one_replica(state: OperatorState):
    kube = FakeKube(owner(replicas=0))
    state.kube = kube  # type: ignore[assignment]
    await signal(state, configmap(stamp="2026-12-01T00:00:00Z"), type_=None)  # the listing
    assert kube.gets == []
    await signal(state, configmap(stamp="2026-12-03T12:00:00Z"))
    assert kube.gets == [("InferenceService", "llm", "tiny")]  # read fresh, not from a cache
    assert kube.scaled == [("llm", "tiny", 1)]


async def test_a_fleet_already_up_is_left_as_it_is(state: OperatorState):
    kube = FakeKube(owner(replicas=2))
    state.kube = kube  # type: ignore[assignment]
    await signal(state, configmap())
    await signal(state, configmap(stamp="2026-12-03T12:00:00Z"))
    assert kube.scaled == []


async def test_a_stamp_for_a_fleet_deleted_meanwhile_does_nothing(state: OperatorState):
    kube = FakeKube(None)
    state.kube = kube  # type: ignore[assignment]
    await signal(state, configmap())
    await signal(state, configmap(stamp="2026-12-03T12:00:00Z"))
    assert kube.scaled == []
