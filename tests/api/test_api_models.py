"""The pydantic models: wire names, defaults, and field-level error paths."""

from __future__ import annotations

import pytest

from frota.api import InferenceService
from frota.plan.validation import SpecError, load

MINIMAL = {
    "apiVersion": "frota.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "tiny"},
    "spec": {"model": {"name": "smollm2", "uri": "alias:smollm2"}},
}


def test_minimal_spec_gets_documented_defaults():
    isvc = InferenceService.from_manifest(MINIMAL)
    spec = isvc.spec
    assert spec.replicas == 1
    assert spec.engine.quantization.weights == "none"
    assert spec.engine.quantization.kvCache == "auto"
    assert spec.engine.kvCache.prefixCaching is True
    assert spec.router.policy == "least-load"
    assert spec.resources.accelerator is None
    assert spec.disaggregation is None
    assert spec.mode == "Colocated"


def test_wire_form_is_camel_case_and_round_trips():
    isvc = InferenceService.from_manifest(MINIMAL)
    wire = isvc.to_wire()
    assert "maxModelLen" not in wire["spec"]["engine"]  # unset optionals stay absent
    assert wire["spec"]["engine"]["kvCache"]["memoryFraction"] == 0.9
    assert InferenceService.from_manifest(wire) == isvc


def test_integer_quantities_are_accepted_as_strings():
    obj = {**MINIMAL, "spec": {**MINIMAL["spec"], "resources": {"cpu": 2, "memory": "3Gi"}}}
    assert InferenceService.from_manifest(obj).spec.resources.cpu == "2"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"replicas": -1}, "spec.replicas"),
        ({"parallelism": {"tensor": 0}}, "spec.parallelism.tensor"),
        ({"router": {"policy": "random"}}, "spec.router.policy"),
        ({"engine": {"kvCache": {"blockSize": 12}}}, "spec.engine.kvCache.blockSize"),
        ({"bogus": 1}, "spec.bogus"),
    ],
)
def test_invalid_fields_are_named_in_the_error(patch, field):
    obj = {**MINIMAL, "spec": {**MINIMAL["spec"], **patch}}
    with pytest.raises(SpecError) as err:
        load(obj)
    assert any(e.field == field for e in err.value.errors), err.value.errors


def test_uri_schemes():
    for uri in ["alias:smollm2", "pvc://models/a/b", "hf://org/repo", "https://x.example/m.gguf",
                "synthetic:tiny"]:
        obj = {**MINIMAL, "spec": {"model": {"name": "m", "uri": uri}}}
        assert InferenceService.from_manifest(obj).spec.model.uri == uri
    with pytest.raises(SpecError):
        load({**MINIMAL, "spec": {"model": {"name": "m", "uri": "ftp://x/y"}}})
