"""`frota up --adapter NAME=PATH` and a manifest's spec.adapters: the workers get the LoRA
flags with local paths; adapters that need a cluster get one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from frota.local.topology import UnsupportedLocally, load, plan

from .conftest import free_port
from .test_local_up_cli import SMOL, frota, manifest


def adapter_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    return path


def worker_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("worker-0:"))


def test_dry_run_with_adapter_flags_gives_the_worker_lora_modules(tmp_path: Path):
    sql, chat = adapter_dir(tmp_path, "sql"), adapter_dir(tmp_path, "chat")
    out = frota("up", "--dry-run", "--port", str(free_port()),
                "--adapter", f"sql={sql}", "--adapter", f"chat={chat}")
    assert out.returncode == 0, out.stderr
    line = worker_line(out.stdout)
    assert "--enable-lora --max-loras 4 --max-lora-rank 16" in line
    assert f"--lora-modules sql={sql} chat={chat}" in line


def test_dry_run_serves_a_manifests_file_adapters_with_its_lora_block(tmp_path: Path):
    sql = adapter_dir(tmp_path, "sql")
    path = manifest(tmp_path, f"{SMOL}\nadapters: [{{name: sql, uri: 'file://{sql}'}}]\n"
                              "engine: {lora: {maxAdapters: 2, maxRank: 8, allowRuntimeLoading: true}}")
    out = frota("up", path, "--dry-run", "--port", str(free_port()))
    assert out.returncode == 0, out.stderr
    line = worker_line(out.stdout)
    assert f"--max-loras 2 --max-lora-rank 8 --lora-modules sql={sql} --allow-runtime-lora" in line


def test_an_adapter_flag_replaces_the_manifests_adapter_of_that_name(tmp_path: Path):
    old, new = adapter_dir(tmp_path, "old"), adapter_dir(tmp_path, "new")
    path = manifest(tmp_path, f"{SMOL}\nadapters: [{{name: sql, uri: 'file://{old}'}}]")
    isvc = load(path, adapters=[("sql", str(new))])
    assert [a.uri for a in isvc.spec.adapters] == [f"file://{new}"]


def test_a_relative_adapter_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    adapter_dir(tmp_path, "sql")
    monkeypatch.chdir(tmp_path)
    group = plan(load(None, adapters=[("sql", "sql")])).groups[0]
    assert f"sql={tmp_path / 'sql'}" in group.ranks[0].args


def test_a_cluster_adapter_is_refused_with_what_to_do_instead(tmp_path: Path):
    path = manifest(tmp_path, f"{SMOL}\nadapters: [{{name: sql, uri: 'hf://org/sql-lora'}}]")
    out = frota("up", path, "--dry-run", "--port", str(free_port()))
    assert out.returncode == 1
    assert "adapter sql (hf://org/sql-lora): hf:// adapters need a cluster" in out.stderr
    assert "--adapter sql=PATH" in out.stderr


def test_a_missing_adapter_directory_is_refused():
    with pytest.raises(UnsupportedLocally, match="is not a directory"):
        plan(load(None, adapters=[("sql", "/nonexistent/sql")]))


@pytest.mark.parametrize("value", ["sql", "=path", "sql="])
def test_a_malformed_adapter_flag_is_a_usage_error(value: str):
    out = frota("up", "--dry-run", "--adapter", value)
    assert out.returncode == 2
    assert "use NAME=PATH" in out.stderr


def test_an_adapter_named_like_the_model_gets_the_field_level_message(tmp_path: Path):
    out = frota("up", "--dry-run", "--adapter", f"smollm2={adapter_dir(tmp_path, 'x')}")
    assert out.returncode == 2
    assert "must differ from spec.model.name" in out.stderr
