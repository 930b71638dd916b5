"""spec.model.cache with the vllm runtime: the Job converts a GGUF model (downloaded, or
baked into Frota's image) into the claim once, so the workers start on the converted
form and no pod converts."""

from __future__ import annotations

from frota.operator.builders import build_children
from frota.operator.builders.model_cache import PROGRESS_PORT
from frota.plan.planner import plan
from tests.isvc_fixtures import Spec

GGUF_URI = "https://models.example/w/m.gguf#sha256=" + "a" * 64


def spec(uri: str, runtime: str = "vllm", cache: bool = True) -> Spec:
    s = Spec().replicas(2).set("spec.model.uri", uri)
    if runtime == "vllm":
        s = (s.set("spec.runtime.engine", "vllm").set("spec.engine.kvCache.blockSize", 32)
             .set("spec.engine.maxModelLen", 2048).set("spec.resources.memory", "5Gi"))
    return s.set("spec.model.cache", {"enabled": True}) if cache else s


def built(s: Spec) -> tuple[list[dict], list[dict]]:
    isvc = s.build()
    objs = build_children(isvc, plan(isvc))
    return [o for o in objs if o["kind"] == "Job"], [o for o in objs if o["kind"] == "StatefulSet"]


def fill_of(job: dict) -> dict:
    [fill] = job["spec"]["template"]["spec"]["containers"]
    return fill


def test_a_downloaded_gguf_is_converted_by_the_job_and_served_converted_by_every_pod():
    [job], statefulsets = built(spec(GGUF_URI))
    key = job["metadata"]["name"].rsplit("-", 1)[-1]
    fill = fill_of(job)
    assert fill["args"] == ["cache", "fill", GGUF_URI, "--dest", f"/cache/{key}/m.gguf",
                            "--cache-dir", f"/cache/{key}", "--progress-port", str(PROGRESS_PORT),
                            "--convert", f"/cache/{key}/converted"]
    # Converting holds the dequantized model once: the rank's memory, not a download's.
    assert fill["resources"]["limits"]["memory"] == fill["resources"]["requests"]["memory"] != "1Gi"
    assert len(statefulsets) == 2
    for sts in statefulsets:
        pod = sts["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["initContainers"]] == ["wait-model-cache"]  # no convert, no fetch
        worker = pod["containers"][0]
        assert worker["args"][0] == "/models/cache/converted"
        assert {"name": "model-cache", "mountPath": "/models/cache", "subPath": key,
                "readOnly": True} in worker["volumeMounts"]


def test_an_image_baked_model_is_converted_once_into_the_claim_instead_of_per_pod():
    [job], [sts, _] = built(spec("alias:smollm2"))
    fill = fill_of(job)
    key = job["metadata"]["name"].rsplit("-", 1)[-1]
    assert fill["args"][:4] == ["cache", "fill", "alias:smollm2", "--dest"]
    assert fill["args"][-2:] == ["--convert", f"/cache/{key}/converted"]
    pod = sts["spec"]["template"]["spec"]
    assert fill["image"] != pod["containers"][0]["image"]  # Frota's image holds the GGUF
    assert [c["name"] for c in pod["initContainers"]] == ["wait-model-cache"]
    assert pod["containers"][0]["args"][0] == "/models/cache/converted"
    assert not any(v["name"] == "converted" for v in pod["volumes"])


def test_without_the_cache_an_image_baked_model_is_still_converted_per_pod():
    jobs, [sts, _] = built(spec("alias:smollm2", cache=False))
    assert jobs == []
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["initContainers"]] == ["convert-model"]


def test_what_needs_no_conversion_is_not_converted():
    [job], _ = built(spec("hf://org/repo"))  # an HF-layout repository: vLLM reads it
    assert "--convert" not in fill_of(job)["args"]
    [job], [sts, _] = built(spec(GGUF_URI, runtime="frota"))  # Frota's engine reads GGUF
    assert "--convert" not in fill_of(job)["args"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["args"].count("/models/cache/m.gguf") == 1
    assert built(spec("alias:smollm2", runtime="frota"))[0] == []  # in the image, read as it is


def test_the_converted_form_is_its_own_cache_directory():
    frota_job = built(spec(GGUF_URI, runtime="frota"))[0][0]["metadata"]["name"]
    vllm_job = built(spec(GGUF_URI))[0][0]["metadata"]["name"]
    assert frota_job != vllm_job  # a directory without the conversion is another directory
    other_image = built(spec("alias:smollm2").set("spec.engine.image", "frota:other"))[0][0]
    assert other_image["metadata"]["name"] != built(spec("alias:smollm2"))[0][0]["metadata"]["name"]
