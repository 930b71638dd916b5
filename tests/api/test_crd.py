"""The generated CRD: fresh in crds/, structural, documented, and admitting what it should."""

from __future__ import annotations

import copy
from pathlib import Path

import celpy
import kubernetes_validate
import pytest
import yaml

from frota.api.crd import crd, openapi_schema
from frota.api.yamlio import dump_all
from tests.api.apiserver_sim import admit, all_rules, default_problems, structural_problems

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "frota.dev_inferenceservices.yaml"
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
SCHEMA = openapi_schema()


def _sample(name: str) -> dict:
    return yaml.safe_load((ROOT / "manifests" / "samples" / name).read_text())


def test_crds_dir_matches_the_models():
    assert CRD_FILE.read_text() == dump_all([crd()]), (
        "crds/ is stale: run `frota crd -o crds/frota.dev_inferenceservices.yaml`"
    )


@pytest.mark.parametrize("version", ["1.33.0", "1.34.0", "1.35.0"])
def test_crd_object_is_a_valid_customresourcedefinition(version):
    kubernetes_validate.validate(crd(), version, strict=True)


def test_schema_is_structural():
    assert list(structural_problems(SCHEMA)) == []


def test_defaults_pass_their_own_schema_and_cel_rules_as_written():
    assert list(default_problems(SCHEMA)) == []


def test_every_field_has_a_description():
    missing = []

    def walk(schema, path):
        for name, sub in schema.get("properties", {}).items():
            if not sub.get("description") and f"{path}.{name}" != ".metadata":
                missing.append(f"{path}.{name}")
            walk(sub, f"{path}.{name}")
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], f"{path}[]")

    walk(SCHEMA, "")
    assert missing == []


def test_every_cel_rule_compiles():
    env = celpy.Environment()
    rules = list(all_rules(SCHEMA))
    assert len(rules) >= 8
    for rule in rules:
        env.compile(rule)


def test_scale_subresource_and_printer_columns():
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Ready", "Replicas", "Mode", "Model", "URL", "Cache", "Age"]


def test_short_name_does_not_clash_with_kserve():
    names = crd()["spec"]["names"]
    assert "isvc" not in names["shortNames"]
    assert names["shortNames"] == ["fisvc"]


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_apiserver_admits_every_sample(path):
    obj = yaml.safe_load(path.read_text())
    defaulted, errors = admit(SCHEMA, obj)
    assert errors == []
    written = obj["spec"].get("engine", {}).get("kvCache", {}).get("blockSize", 16)
    assert defaulted["spec"]["engine"]["kvCache"]["blockSize"] == written  # nested defaults filled
    assert defaulted["spec"]["engine"]["kvCache"]["memoryFraction"] == 0.9


def _with(patch_path: str, value, base: str = "cpu-tiny-smollm2.yaml") -> dict:
    obj = copy.deepcopy(_sample(base))
    node = obj
    *parents, leaf = patch_path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return obj


BAD_SPECS = {
    "wrong enum": (_with("spec.router.policy", "random"), "random"),
    "negative replicas": (_with("spec.replicas", -1), "-1"),
    "unknown field": (_with("spec.engine.maxTokens", 5), "maxTokens"),
    "unknown uri scheme": (_with("spec.model.uri", "s3://bucket/model"), "s3://"),
    "quantization enum": (_with("spec.engine.quantization", {"weights": "int3"}), "int3"),
    "cel: autoscaling min > max": (
        _with("spec.autoscaling", {"minReplicas": 5, "maxReplicas": 2, "target": 4}),
        "minReplicas must not exceed maxReplicas",
    ),
    "cel: role autoscaling min > max": (
        _with("spec.disaggregation", {"decode": {"autoscaling": {
            "minReplicas": 4, "maxReplicas": 2, "target": 4}}}),
        "minReplicas must not exceed maxReplicas",
    ),
    "role autoscaling above the role's bound": (
        _with("spec.disaggregation", {"prefill": {"autoscaling": {"maxReplicas": 65, "target": 4}}}),
        "65",
    ),
    "cel: expert does not divide tensor": (
        _with("spec.parallelism", {"tensor": 3, "expert": 2}), "expert must divide tensor",
    ),
    "cel: fp8 on cpu": (
        _with("spec.engine.quantization", {"weights": "fp8"}), "fp8 quantization needs an accelerator",
    ),
    "cel: rollout cannot progress": (
        _with("spec.rollout", {"maxUnavailable": 0, "maxSurge": "0%"}), "cannot both be zero",
    ),
    "cel: negative maxSurge": (_with("spec.rollout", {"maxSurge": -1}), "non-negative"),
    "cel: pipeline in a disaggregated role": (
        _with("spec.disaggregation", {"prefill": {"parallelism": {"pipeline": 2}}}),
        "do not support pipeline parallelism",
    ),
    "cel: prefill and decode tensor differ": (
        _with("spec.disaggregation", {"decode": {"parallelism": {"tensor": 3}}}),
        "same tensor-parallel size",
    ),
    "cel: env value and valueFrom": (
        _with("spec.engine.env", [{"name": "A", "value": "1",
                                   "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        "not both",
    ),
    "cel: name too long": (_with("metadata.name", "a" * 41), "at most 40 characters"),
    "adapter name with '='": (_with("spec.adapters", [{"name": "a=b", "uri": "hf://org/a"}]), "a=b"),
    "adapter name with ','": (_with("spec.adapters", [{"name": "a,b", "uri": "hf://org/a"}]), "a,b"),
    "adapter uri scheme": (_with("spec.adapters", [{"name": "a", "uri": "alias:smollm2"}]), "alias:"),
    "adapter pvc uri without a path": (_with("spec.adapters", [{"name": "a", "uri": "pvc://claim"}]),
                                       "pvc://claim"),
    "lora rank not a slot rank": (_with("spec.engine.lora", {"maxRank": 12}), "12"),
    "lora without slots": (_with("spec.engine.lora", {"maxAdapters": 0}), "0"),
    "cel: adapter named as the model": (
        _with("spec.adapters", [{"name": "smollm2", "uri": "hf://org/a"}]), "must differ from spec.model.name",
    ),
    "cel: adapter names repeat": (
        _with("spec.adapters", [{"name": "a", "uri": "hf://org/a"}, {"name": "a", "uri": "hf://org/b"}]),
        "adapter names must be unique",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SPECS), ids=list(BAD_SPECS))
def test_apiserver_rejects_bad_spec(case):
    obj, fragment = BAD_SPECS[case]
    _, errors = admit(SCHEMA, obj)
    assert errors, f"{case} was admitted"
    assert any(fragment in e for e in errors), errors


@pytest.mark.parametrize("case", list(BAD_SPECS), ids=list(BAD_SPECS))
def test_pydantic_rejects_what_the_apiserver_rejects(case):
    from frota.plan.validation import SpecError, load

    obj, _ = BAD_SPECS[case]
    with pytest.raises(SpecError):
        load(obj)


ADAPTERS = [{"name": "sql", "uri": "pvc://adapters/sql"}, {"name": "chat.v2", "uri": "hf://org/chat-lora"},
            {"name": "tone_1", "uri": "https://example.com/tone.tar"}, {"name": "local", "uri": "file:///opt/a"}]


def test_apiserver_admits_adapters_without_a_lora_block():
    defaulted, errors = admit(SCHEMA, _with("spec.adapters", ADAPTERS))
    assert errors == []
    assert "lora" not in defaulted["spec"]["engine"]  # the planner applies LoRA's defaults


def test_apiserver_fills_the_lora_blocks_defaults():
    defaulted, errors = admit(SCHEMA, _with("spec.engine.lora", {"maxRank": 64}))
    assert errors == []
    assert defaulted["spec"]["engine"]["lora"] == {"maxAdapters": 4, "maxRank": 64, "allowRuntimeLoading": False}
