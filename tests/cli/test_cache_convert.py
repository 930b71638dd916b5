"""`frota cache fill --convert DIR`: the GGUF model is converted into DIR (for vLLM) before
the marker, atomically, so a killed conversion leaves nothing a worker would load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frota.api.contract import CacheJob
from frota.cli import cache
from frota.cli.main import main
from frota.engine.loader import export
from tests.cli.https_server import LocalCA, serving

GGUF = b"GGUF" + bytes(range(256)) * 8


@pytest.fixture(autouse=True)
def trusted(local_ca: LocalCA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    monkeypatch.delenv("HF_TOKEN", raising=False)


def fake_export(fail_after_first_file: bool = False):
    """An exporter that writes two files (and can die between them), recording its source."""
    seen: list[str] = []

    def export_hf(model: str, directory: Path, dtype: str = "float32", verbose: bool = True) -> None:
        seen.append(model)
        directory = Path(directory)
        directory.mkdir(parents=True)
        (directory / "config.json").write_text("{}")
        if fail_after_first_file:
            raise KeyboardInterrupt  # as a killed pod: no handler of ours runs past it
        (directory / "model.safetensors").write_bytes(b"w" * 64)

    return export_hf, seen


def test_a_downloaded_gguf_is_converted_before_the_marker(
        local_ca: LocalCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, seen = fake_export()
    monkeypatch.setattr(export, "export_hf", exporter)
    dest, converted = tmp_path / "key" / "m.gguf", tmp_path / "key" / "converted"
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        assert main(["cache", "fill", f"{base}/w/m.gguf", "--dest", str(dest), "--convert", str(converted)]) == 0
    assert seen == [str(dest)]
    marker = json.loads((tmp_path / "key" / CacheJob.MARKER).read_text())
    assert marker["converted"] == "converted" and marker["checked"] == ["content-length", "converted"]
    assert set(marker["files"]) == {"m.gguf", "converted/config.json", "converted/model.safetensors"}
    assert marker["bytes"] == len(GGUF) + 2 + 64
    assert sorted(p.name for p in converted.iterdir()) == ["config.json", "model.safetensors"]


def test_an_image_baked_model_is_only_converted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, seen = fake_export()
    monkeypatch.setattr(export, "export_hf", exporter)
    dest, converted = tmp_path / "key" / "smollm2", tmp_path / "key" / "converted"
    assert main(["cache", "fill", "alias:smollm2", "--dest", str(dest), "--convert", str(converted)]) == 0
    assert seen == ["smollm2"] and not dest.exists()
    marker = json.loads((tmp_path / "key" / CacheJob.MARKER).read_text())
    assert marker["checked"] == ["converted"]
    assert set(marker["files"]) == {"converted/config.json", "converted/model.safetensors"}
    # ...and without --convert there is nothing to do for it
    assert main(["cache", "fill", "alias:smollm2", "--dest", str(tmp_path / "other" / "x")]) == 2


def test_a_conversion_killed_midway_leaves_no_marker_and_the_next_run_redoes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest, converted = tmp_path / "key" / "smollm2", tmp_path / "key" / "converted"
    dest.parent.mkdir()
    dying, _ = fake_export(fail_after_first_file=True)
    monkeypatch.setattr(export, "export_hf", dying)
    with pytest.raises(KeyboardInterrupt):
        main(["cache", "fill", "alias:smollm2", "--dest", str(dest), "--convert", str(converted)])
    assert cache.read_marker(tmp_path / "key") is None
    assert not converted.exists()
    # A SIGKILL runs no cleanup: what it leaves is a partial, or a whole copy without a marker.
    (tmp_path / "key" / "converted.partial-99").mkdir()
    (tmp_path / "key" / "converted.partial-99" / "config.json").write_text("{half")
    converted.mkdir()
    (converted / "model.safetensors").write_bytes(b"stale")
    exporter, _ = fake_export()
    monkeypatch.setattr(export, "export_hf", exporter)
    assert main(["cache", "fill", "alias:smollm2", "--dest", str(dest), "--convert", str(converted)]) == 0
    assert sorted(p.name for p in (tmp_path / "key").iterdir()) == [CacheJob.MARKER, "converted"]
    assert (converted / "model.safetensors").read_bytes() == b"w" * 64


def test_a_marker_without_the_conversion_is_not_the_work_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, seen = fake_export()
    monkeypatch.setattr(export, "export_hf", exporter)
    dest, converted = tmp_path / "key" / "smollm2", tmp_path / "key" / "converted"
    dest.parent.mkdir()
    (tmp_path / "key" / CacheJob.MARKER).write_text(json.dumps({"uri": "alias:smollm2"}))
    assert main(["cache", "fill", "alias:smollm2", "--dest", str(dest), "--convert", str(converted)]) == 0
    assert seen == ["smollm2"]
    assert main(["cache", "fill", "alias:smollm2", "--dest", str(dest), "--convert", str(converted)]) == 0
    assert seen == ["smollm2"]  # now it is


def test_a_model_the_exporter_refuses_fails_with_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest, converted = tmp_path / "key" / "m", tmp_path / "key" / "converted"
    dest.parent.mkdir()
    # another try cannot help: the status that fails the Job at once
    assert main(["cache", "fill", "alias:no-such-model", "--dest", str(dest), "--convert", str(converted)]) == \
        CacheJob.EXIT_PERMANENT
    assert "cannot convert" in capsys.readouterr().err
    assert cache.read_marker(tmp_path / "key") is None and not converted.exists()


@pytest.mark.slow
def test_smollm2_converted_by_fill_is_what_vllm_and_the_loader_read(tmp_path: Path) -> None:
    from frota.engine.loader import resolve_model

    dest, converted = tmp_path / "key" / "smollm2", tmp_path / "key" / "converted"
    dest.parent.mkdir()
    assert main(["cache", "fill", "alias:smollm2", "--dest", str(dest), "--convert", str(converted)]) == 0
    assert resolve_model(str(converted)).kind == "safetensors"
    assert json.loads((converted / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    marker = cache.read_marker(tmp_path / "key")
    assert marker is not None and "converted/model.safetensors" in marker["files"]
