"""`frota render` and `frota plan` on files: multi-doc YAML out, field-level errors, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "manifests" / "samples" / "cpu-tiny-smollm2.yaml"


def frota(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frota.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_render_prints_every_child_as_multi_document_yaml():
    out = frota("render", str(SAMPLE), "-n", "demo")
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("StatefulSet") == 2
    assert {"ConfigMap", "Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "Role"} <= set(kinds)
    assert {d["metadata"]["namespace"] for d in docs} == {"demo"}
    assert "&id" not in out.stdout  # no YAML anchors for reviewers to chase


def test_invalid_spec_exits_nonzero_with_the_field_named(tmp_path):
    bad = yaml.safe_load(SAMPLE.read_text())
    bad["spec"]["parallelism"] = {"tensor": 2}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    for command in ("render", "plan"):
        out = frota(command, str(path))
        assert out.returncode == 1
        assert "spec.parallelism.tensor: 2 does not divide the 9 attention heads of smollm2" in out.stderr
        assert "InferenceService smollm2-cpu" in out.stderr
        assert out.stdout == ""


def test_schema_errors_are_reported_by_field_too():
    out = frota("render", "-", stdin="kind: InferenceService\nmetadata: {name: x}\nspec:\n  model: {name: m, uri: 'alias:smollm2'}\n  replicas: -2\n")
    assert out.returncode == 1
    assert "spec.replicas:" in out.stderr


def test_plan_explains_groups_and_memory():
    out = frota("plan", str(SAMPLE))
    assert out.returncode == 0, out.stderr
    assert "worker: 2 group(s) x 1 rank(s)" in out.stdout
    assert "sequences of 2048 tokens that fit" in out.stdout


def test_crd_command_prints_the_crd():
    out = frota("crd")
    assert out.returncode == 0
    assert yaml.safe_load(out.stdout)["kind"] == "CustomResourceDefinition"
