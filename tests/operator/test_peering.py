"""The kopf peering objects `frota operator --peering NAME` creates when missing."""

from __future__ import annotations

from frota.operator.peering import peering_objects


def test_cluster_wide_operator_creates_one_cluster_kopf_peering():
    ((path, obj),) = peering_objects("frota", None)
    assert path == "/apis/kopf.dev/v1/clusterkopfpeerings"
    assert obj == {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                   "metadata": {"name": "frota"}}


def test_namespaced_operator_creates_one_kopf_peering_per_named_namespace():
    objs = peering_objects("frota", ["team-a", "team-*", "team-b"])
    assert [p for p, _ in objs] == ["/apis/kopf.dev/v1/namespaces/team-a/kopfpeerings",
                                    "/apis/kopf.dev/v1/namespaces/team-b/kopfpeerings"]
    assert all(o["kind"] == "KopfPeering" and o["metadata"]["name"] == "frota" for _, o in objs)
