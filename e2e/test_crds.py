"""The CRD as the real apiserver serves it: explain shows the descriptions, bad specs are refused by field."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fleet import fresh_namespace
from e2e.kube import Cluster, wait_until

REPO = Path(__file__).resolve().parents[1]
SAMPLES = sorted((REPO / "manifests" / "samples").glob("*.yaml"))
CRD_NAME = "inferenceservices.frota.dev"


def _sample() -> dict[str, Any]:
    return yaml.safe_load((REPO / "manifests" / "samples" / "cpu-tiny-smollm2.yaml").read_text())


def _with(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(_sample())
    node = obj
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return obj


def _vllm(**spec: Any) -> dict[str, Any]:
    """The sample on the vllm runtime (with vLLM's CPU block size), plus `spec`."""
    obj = _with("spec.runtime", {"engine": "vllm"})
    obj["spec"]["engine"]["kvCache"] = {"blockSize": 32}
    obj["spec"].update(spec)
    return obj


# (object, what the apiserver's message must name: the field, and what was wrong)
BAD_SPECS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "wrong enum": (_with("spec.router.policy", "random"), ("spec.router.policy", "random")),
    "negative replicas": (_with("spec.replicas", -1), ("spec.replicas", "-1")),
    "unknown field": (_with("spec.engine.maxTokens", 5), ("spec.engine.maxTokens",)),
    "unknown uri scheme": (_with("spec.model.uri", "s3://bucket/model"), ("spec.model.uri",)),
    "cel: autoscaling min > max": (
        _with("spec.autoscaling", {"minReplicas": 5, "maxReplicas": 2, "target": 4}),
        ("spec.autoscaling", "minReplicas must not exceed maxReplicas"),
    ),
    "cel: expert does not divide tensor": (
        _with("spec.parallelism", {"tensor": 3, "expert": 2}),
        ("spec.parallelism.expert", "expert must divide tensor"),
    ),
    "cel: vllm cannot disaggregate": (
        _vllm(disaggregation={}),
        ("spec.disaggregation", "runtime.engine vllm serves colocated replicas only"),
    ),
    "cel: vllm on CPU with 16-token blocks": (
        _with("spec.runtime", {"engine": "vllm"}),
        ("spec.engine.kvCache.blockSize", "blocks of 32 tokens"),
    ),
    "cel: rollout cannot progress": (
        _with("spec.rollout", {"maxUnavailable": 0, "maxSurge": "0%"}),
        ("spec.rollout", "cannot both be zero"),
    ),
}


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> Iterator[str]:
    """crds/ applied (kubectl apply -k crds/) and Established; a namespace to try objects in."""
    cluster.kubectl("apply", "--server-side", "--field-manager=frota-e2e", "-k", str(REPO / "crds"))
    cluster.wait_crds_established([CRD_NAME])
    # Discovery (what kubectl explain reads) follows the CRD a moment later.
    wait_until("the kind in discovery", lambda: "inferenceservices" in cluster.kubectl(
        "api-resources", "--api-group=frota.dev", check=False), timeout=30)
    with fresh_namespace(cluster) as namespace:
        yield namespace


def test_kubectl_explain_shows_the_field_descriptions(cluster: Cluster, crds: str) -> None:
    top = cluster.kubectl("explain", "inferenceservice.spec")
    assert "KIND:       InferenceService" in top or "InferenceService" in top
    for field in ("model", "engine", "replicas", "parallelism", "disaggregation", "router"):
        assert f"\n  {field}\t" in top, f"{field} missing from explain:\n{top}"
    kv = cluster.kubectl("explain", "inferenceservice.spec.engine.kvCache.memoryFraction")
    assert "Fraction of each rank's memory" in kv, kv
    tensor = cluster.kubectl("explain", "inferenceservice.spec.parallelism.tensor")
    assert "Tensor-parallel size" in tensor, tensor


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_sample_is_admitted(cluster: Cluster, crds: str, path: Path) -> None:
    cluster.kubectl("create", "--dry-run=server", "-n", crds, "-f", str(path))


@pytest.mark.parametrize("case", list(BAD_SPECS), ids=list(BAD_SPECS))
def test_a_bad_spec_is_rejected_naming_the_field(
    cluster: Cluster, crds: str, case: str
) -> None:
    obj, fragments = BAD_SPECS[case]
    with pytest.raises(RuntimeError) as refused:
        cluster.kubectl("create", "--dry-run=server", "--validate=strict", "-n", crds,
                        "-f", "-", input=yaml.safe_dump(obj))
    message = str(refused.value)
    for fragment in fragments:
        assert fragment in message, message
