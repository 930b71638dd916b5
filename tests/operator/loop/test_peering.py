"""The kopf peering objects `frota operator --peering NAME` creates when missing."""

from __future__ import annotations

from frota.operator.loop.peering import peering_objects


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


def _args(*argv: str):
    import argparse

    from frota.operator.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_replicas_of_one_deployment_draw_distinct_peering_priorities():
    # kopf pauses every replica when two live peers share a priority, so the two replicas of
    # the production overlay (the same flags) must not both take kopf's default of 0
    from frota.operator.cli import peering_priority

    drawn = {peering_priority(_args("--peering", "frota")) for _ in range(50)}
    assert len(drawn) == 50
    assert all(0 < p < 2**31 for p in drawn)


def test_a_set_peering_priority_is_kept(monkeypatch):
    from frota.operator.cli import peering_priority

    assert peering_priority(_args("--peering", "frota", "--priority", "7")) == 7
    monkeypatch.setenv("FROTA_OPERATOR_PRIORITY", "12")
    assert peering_priority(_args("--peering", "frota")) == 12


def test_run_hands_kopf_the_priority(monkeypatch):
    import kopf

    from frota.operator import cli

    seen = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: seen.update(kwargs))
    cli.run(_args("--peering", "frota", "--priority", "5", "--metrics-port", "0"))
    assert seen["priority"] == 5 and seen["peering_name"] == "frota"
