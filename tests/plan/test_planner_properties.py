"""Planner invariants over many specs: it either plans or names the fields at fault, never crashes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from frota.operator.builders import build_children
from frota.plan.planner import plan
from frota.plan.validation import SpecError
from tests.isvc_fixtures import Spec

sizes = st.sampled_from([1, 2, 3, 4, 5, 6, 8])


@settings(max_examples=60, deadline=None)
@given(tensor=sizes, pipeline=sizes, replicas=st.integers(0, 4), gpu=st.booleans(),
       uri=st.sampled_from(["alias:smollm2", "synthetic:moe-small", "synthetic:dense-tiny", "hf://org/m"]))
def test_plan_either_succeeds_consistently_or_names_spec_fields(tensor, pipeline, replicas, gpu, uri):
    spec = Spec(uri=uri).tensor(tensor).pipeline(pipeline).replicas(replicas)
    if gpu:
        spec.gpu()
    isvc = spec.build()
    try:
        topo = plan(isvc)
    except SpecError as exc:
        assert exc.errors
        assert all(e.field.startswith("spec.") for e in exc.errors)
        return
    assert len(topo.groups) == replicas
    for group in topo.groups:
        assert group.world_size == tensor * pipeline
        assert [r.env["FROTA_RANK"] for r in group.ranks] == [str(i) for i in range(tensor * pipeline)]
        assert len({r.env["FROTA_MASTER_ADDR"] for r in group.ranks}) == 1
    keys = [(o["kind"], o["metadata"]["name"]) for o in build_children(isvc, topo)]
    assert len(keys) == len(set(keys))
