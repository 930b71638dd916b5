"""The fleet key: one Secret per fleet, owned by it, created when missing and never written
again; mounted read-only, as a directory, into the router and Frota's workers."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from frota.api.contract import FleetKey
from frota.operator.builders import build_children
from frota.operator.builders.fleet_key import fleet_key_secret, with_new_key
from frota.operator.loop import fleet_key
from frota.plan.planner import plan
from tests.isvc_fixtures import Spec

ROOT = Path(__file__).resolve().parents[2]
HEX64 = re.compile(r"[0-9a-f]{64}")


def pod_specs(spec: Spec) -> dict[str, dict[str, Any]]:
    """Pod spec of every workload, by its name."""
    isvc = spec.build()
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"]
            for o in build_children(isvc, plan(isvc)) if o["kind"] in ("Deployment", "StatefulSet")}


def key_mount(pod: Mapping[str, Any]) -> tuple[dict, dict, dict] | None:
    """(volume, mount, env) of the fleet key in the pod's one container, or None."""
    volumes = [v for v in pod["volumes"] if "secret" in v
               and v["secret"]["secretName"] == "tiny" + FleetKey.SECRET_SUFFIX]
    if not volumes:
        return None
    (volume,) = volumes
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    (env,) = [e for e in container["env"] if e["name"] == FleetKey.FILE_ENV]
    return volume, mount, env


def test_the_secret_is_the_fleets_own_and_holds_no_key_until_created():
    secret = fleet_key_secret(Spec().build())
    assert secret["metadata"]["name"] == "tiny-fleet-key"
    assert secret["metadata"]["namespace"] == "llm"
    assert secret["metadata"]["labels"]["app.kubernetes.io/instance"] == "tiny"
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", "tiny", True)
    assert "data" not in secret and "stringData" not in secret


def test_each_created_key_is_32_fresh_random_bytes_and_the_template_is_left_alone():
    template = fleet_key_secret(Spec().build())
    first, second = with_new_key(template), with_new_key(template)
    keys = [s["stringData"][FleetKey.DATA_KEY] for s in (first, second)]
    assert all(HEX64.fullmatch(k) for k in keys), keys
    assert keys[0] != keys[1]
    assert "stringData" not in template


@pytest.mark.parametrize("spec", [Spec(), Spec().disaggregated(), Spec().pipeline(2)],
                         ids=["worker", "prefill-decode", "two-ranks"])
def test_the_router_and_every_frota_worker_mount_the_key_read_only_as_a_directory(spec: Spec):
    pods = pod_specs(spec)
    assert len(pods) >= 2
    for name, pod in pods.items():
        found = key_mount(pod)
        assert found is not None, name
        volume, mount, env = found
        # A directory, not subPath: the kubelet's refresh of a rotated Secret reaches it.
        assert "subPath" not in mount and mount["mountPath"] == FleetKey.MOUNT_DIR
        assert mount["readOnly"] is True
        assert volume["secret"]["items"] == [{"key": FleetKey.DATA_KEY, "path": FleetKey.DATA_KEY}]
        assert volume["secret"]["defaultMode"] & 0o222 == 0  # nobody writes it
        assert env["value"] == FleetKey.FILE == f"{mount['mountPath']}/{FleetKey.DATA_KEY}"


def test_vllm_workers_do_not_get_the_key_but_their_router_does():
    spec = (Spec().set("spec.runtime", {"engine": "vllm"})
            .set("spec.engine", {"dtype": "float32", "maxModelLen": 2048, "kvCache": {"blockSize": 32}})
            .set("spec.resources", {"cpu": "2", "memory": "5Gi"}))
    pods = pod_specs(spec)
    assert key_mount(pods.pop("tiny-router")) is not None
    assert pods and all(key_mount(pod) is None for pod in pods.values())


def test_the_user_env_can_still_point_a_worker_at_another_key_file():
    # The operator's env comes before the user's (spec.engine.env), which wins.
    pod = pod_specs(Spec().set("spec.engine", {"env": [
        {"name": FleetKey.FILE_ENV, "value": "/elsewhere"}]}))["tiny-worker-0"]
    names = [e["name"] for e in pod["containers"][0]["env"]]
    assert names.count(FleetKey.FILE_ENV) == 2
    assert pod["containers"][0]["env"][-1] == {"name": FleetKey.FILE_ENV, "value": "/elsewhere"}


@pytest.mark.parametrize("sample", sorted((ROOT / "manifests" / "samples").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_frota_render_prints_no_secret_and_no_key(sample: Path):
    out = subprocess.run([sys.executable, "-m", "frota.cli.main", "render", str(sample)],
                         capture_output=True, text=True, timeout=120, check=True, cwd=ROOT).stdout
    assert "kind: Secret" not in out
    assert not HEX64.search(out)
    assert "fleet-key" in out  # it is mounted, by name


class FakeApi:
    """The API server as the operator sees Secrets: it can create one, and learn it exists."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.posts: list[str] = []

    async def create_if_missing(self, path: str, obj: Mapping[str, Any]) -> bool:
        self.posts.append(path)
        name = obj["metadata"]["name"]
        if name in self.secrets:
            return False  # 409
        self.secrets[name] = dict(obj)
        return True


def body(uid: str = "uid-1", **meta: Any) -> dict[str, Any]:
    manifest = Spec().manifest()
    manifest["metadata"].update(uid=uid, generation=1, **meta)
    return manifest


async def test_the_key_is_created_when_missing_and_never_overwritten():
    api = FakeApi()
    assert await fleet_key.ensure(api, body()) == "created"
    key = api.secrets["tiny-fleet-key"]["stringData"][FleetKey.DATA_KEY]
    assert api.posts == ["/api/v1/namespaces/llm/secrets"]
    api.secrets["tiny-fleet-key"]["stringData"] = {FleetKey.DATA_KEY: "rotated-by-the-user"}
    assert await fleet_key.ensure(api, body()) == "exists"
    assert api.secrets["tiny-fleet-key"]["stringData"] == {FleetKey.DATA_KEY: "rotated-by-the-user"}
    del api.secrets["tiny-fleet-key"]  # the user deleted it: a new one, with a new key
    assert await fleet_key.ensure(api, body()) == "created"
    assert api.secrets["tiny-fleet-key"]["stringData"][FleetKey.DATA_KEY] != key


async def test_no_key_for_an_invalid_spec_or_an_object_going_away():
    api = FakeApi()
    invalid = body()
    invalid["spec"]["parallelism"] = {"tensor": 7}  # does not divide the heads
    assert await fleet_key.ensure(api, invalid) == "not wanted"
    assert await fleet_key.ensure(api, body(deletionTimestamp="2026-01-01T00:00:00Z")) == "not wanted"
    assert api.posts == []


async def test_the_reconcile_loop_makes_sure_once_per_object_and_again_for_a_namesake():
    api, made_sure = FakeApi(), {}
    assert await fleet_key.ensure_once(api, body(), made_sure) == "created"
    assert await fleet_key.ensure_once(api, body(), made_sure) == "exists"
    assert len(api.posts) == 1  # a reconcile with nothing to change makes no API call
    del api.secrets["tiny-fleet-key"]  # deleted and made again under the same name
    assert await fleet_key.ensure_once(api, body(uid="uid-2"), made_sure) == "created"
    assert made_sure == {("llm", "tiny"): "uid-2"}


async def test_an_invalid_spec_gets_its_key_once_it_is_fixed():
    api, made_sure = FakeApi(), {}
    invalid = body()
    invalid["spec"]["parallelism"] = {"tensor": 7}
    assert await fleet_key.ensure_once(api, invalid, made_sure) == "not wanted"
    assert await fleet_key.ensure_once(api, body(), made_sure) == "created"
