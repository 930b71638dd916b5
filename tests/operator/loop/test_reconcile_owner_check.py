"""A reconcile whose cached owner is behind the API server does not recreate children.

The owner and its children arrive on separate watches, so a child's deletion
can reach the operator before its owner's deletionTimestamp does. These unit
tests hand the reconcile a fake API (`get`, `apply`, ...) to make that
ordering certain; tests/operator/loop/test_handlers.py plays it on the
emulated API server.
"""

from __future__ import annotations

from typing import Any

import pytest

from frota.operator.loop import reconcile as reconcile_module
from frota.operator.loop.children import Children
from frota.operator.loop.reconcile import reconcile
from tests.operator.conftest import sample


class FakeApi:
    """Records writes; answers GETs of the owner with whatever a test sets."""

    def __init__(self, live_owner: dict[str, Any] | None) -> None:
        self.live_owner = live_owner
        self.gets: list[tuple[str, str, str]] = []
        self.applied: list[str] = []

    async def get(self, kind: str, namespace: str, name: str) -> Any:
        self.gets.append((kind, namespace, name))
        return self.live_owner

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
        return {"metadata": {"resourceVersion": "1"}}

    async def patch_status(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        pass


def cached_owner() -> dict[str, Any]:
    body = sample("tiny", replicas=1)
    body["metadata"].update(uid="uid-1", generation=1, resourceVersion="5")
    return body


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    monkeypatch.setattr(reconcile_module.kopf, "event", lambda *a, **k: None)
    return FakeApi(live_owner=None)


NO_CHILDREN = Children(objects=(), pods=(), endpoint_slices=None)


@pytest.mark.parametrize("live", ["being deleted", "gone", "a namesake"])
async def test_missing_children_are_not_created_for_an_owner_that_is_going(
    fake_api: FakeApi, live: str
) -> None:
    owner = cached_owner()
    if live == "being deleted":
        fake_api.live_owner = {**owner, "metadata": {
            **owner["metadata"], "deletionTimestamp": "2026-11-30T00:00:00Z"}}
    elif live == "a namesake":  # deleted and created again since the cache saw it
        fake_api.live_owner = {**owner, "metadata": {**owner["metadata"], "uid": "uid-2"}}
    outcome = await reconcile(owner, NO_CHILDREN, api=fake_api)
    assert outcome.result == "deleting"
    assert fake_api.applied == [] and outcome.applied == []
    assert fake_api.gets == [("InferenceService", "default", "tiny")]


async def test_missing_children_are_created_once_the_api_server_confirms_the_owner(
    fake_api: FakeApi,
) -> None:
    owner = cached_owner()
    fake_api.live_owner = owner
    outcome = await reconcile(owner, NO_CHILDREN, api=fake_api)
    assert outcome.result == "progressing"
    assert "StatefulSet/tiny-worker-0" in fake_api.applied
    assert len(fake_api.gets) == 1  # one GET per reconcile that creates, not one per child


async def test_an_owner_being_deleted_is_left_alone(fake_api: FakeApi) -> None:
    owner = cached_owner()
    owner["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    outcome = await reconcile(owner, NO_CHILDREN, api=fake_api)
    assert outcome.result == "deleting" and outcome.status is None
    assert fake_api.gets == [] and fake_api.applied == []
