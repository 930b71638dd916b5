"""`spec.runtime`: the vllm runtime's refusals, the same from the apiserver (CEL) and pydantic."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest

from frota.api.runtime import VLLM_IMAGE, VLLM_RULES, VLLM_VERSION
from frota.api.spec import InferenceServiceSpec
from tests.api.apiserver_sim import admit
from tests.api.test_crd import SCHEMA, _sample

BASE = {"model": {"name": "smollm2", "uri": "alias:smollm2"}, "runtime": {"engine": "vllm"},
        "engine": {"kvCache": {"blockSize": 32}}}

# field path of the rule -> a spec fragment that breaks it
REFUSED = {
    ".disaggregation": {"disaggregation": {}},
    ".engine.quantization.weights": {"engine": {"kvCache": {"blockSize": 32},
                                                "quantization": {"weights": "int4"}}},
    ".engine.quantization.kvCache": {"engine": {"kvCache": {"blockSize": 32},
                                                "quantization": {"kvCache": "int8"}}},
    ".engine.kvCache.blockSize": {"engine": {"kvCache": {"blockSize": 16}}},
    ".model.uri": {"model": {"name": "tiny", "uri": "synthetic:dense-tiny"}},
    ".parallelism.expert": {"parallelism": {"tensor": 4, "expert": 2}},
    ".engine.extraArgs": {"engine": {"kvCache": {"blockSize": 32}, "extraArgs": ["--max-num-seqs=8"]}},
}


def _manifest(spec: dict) -> dict:
    obj = copy.deepcopy(_sample("cpu-tiny-smollm2.yaml"))
    obj["spec"] = spec
    return obj


def test_every_rule_has_a_case():
    assert sorted(REFUSED) == sorted(r.field_path for r in VLLM_RULES)


@pytest.mark.parametrize("field", list(REFUSED))
def test_vllm_refuses_what_it_cannot_serve(field):
    rule = next(r for r in VLLM_RULES if r.field_path == field)
    spec = {**BASE, **REFUSED[field]}
    _, errors = admit(SCHEMA, _manifest(spec))
    assert any(rule.message in e for e in errors), errors
    with pytest.raises(ValueError, match=r"runtime|extraArgs"):
        InferenceServiceSpec.model_validate(spec)


@pytest.mark.parametrize("field", list(REFUSED))
def test_frota_runtime_accepts_the_same_fields(field):
    spec = {**REFUSED[field], "model": REFUSED[field].get("model", BASE["model"])}
    if field == ".engine.quantization.weights":
        spec["engine"] = {"quantization": {"weights": "int4"}}
    InferenceServiceSpec.model_validate(spec)  # no vLLM rule applies to runtime.engine frota
    assert not [e for e in admit(SCHEMA, _manifest(spec))[1] if "runtime.engine vllm" in e]


@pytest.mark.parametrize("ok", [
    {},
    {"parallelism": {"tensor": 2, "expert": 2}},
    {"parallelism": {"tensor": 2, "pipeline": 2}},
    {"engine": {"quantization": {"weights": "fp8", "kvCache": "fp8"}},
     "resources": {"accelerator": {"count": 1}}},
    {"engine": {"kvCache": {"blockSize": 16}}, "resources": {"accelerator": {"count": 1}}},
    {"runtime": {"engine": "vllm", "args": ["--enforce-eager"]}},
])
def test_vllm_admits_what_it_serves(ok):
    spec = {**BASE, **ok}
    assert admit(SCHEMA, _manifest(spec))[1] == []
    InferenceServiceSpec.model_validate(spec)


def test_worker_image_defaults_per_runtime():
    vllm = InferenceServiceSpec.model_validate(BASE)
    assert vllm.worker_image == VLLM_IMAGE
    frota = InferenceServiceSpec.model_validate({"model": BASE["model"]})
    assert frota.runtime.engine == "frota" and frota.worker_image == frota.engine.image
    mine = InferenceServiceSpec.model_validate({**BASE, "runtime": {"engine": "vllm", "image": "me/vllm:cpu"}})
    assert mine.worker_image == "me/vllm:cpu"


def test_the_default_vllm_image_is_the_version_the_cpu_image_and_local_env_install() -> None:
    # scripts/vllm-env.sh installs vLLM locally and in the vLLM image; the API's default
    # (GPU) image must name the same release.
    script = Path(__file__).parents[2] / "scripts" / "vllm-env.sh"
    version, torch = subprocess.run(["bash", str(script), "versions"], capture_output=True,
                                    text=True, check=True).stdout.split()
    assert version == VLLM_VERSION
    assert VLLM_IMAGE.endswith(f":v{version}")
    assert torch.count(".") == 2
