"""`frota fetch URI --dest PATH` against a real HTTPS server: adapters and models by their
layouts, trust through SSL_CERT_FILE, and failures that leave nothing at DEST."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from frota.cli.main import main
from frota.server.fetch import FetchError, fetch_adapter, fetch_model
from tests.cli.https_server import LocalCA, Truncated, serving, tar_gz

CONFIG = json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                     "target_modules": ["q_proj"]}).encode()
WEIGHTS = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(range(256)) * 64  # not parsed here
ADAPTER = {"adapter_config.json": CONFIG, "adapter_model.safetensors": WEIGHTS}


@pytest.fixture(autouse=True)
def trusted(local_ca: LocalCA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    monkeypatch.delenv("HF_TOKEN", raising=False)


def under(prefix: str, files: dict[str, bytes]) -> dict[str, bytes | Truncated]:
    return {f"{prefix}/{name}": data for name, data in files.items()}


def files_in(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_a_directory_url_fetches_the_adapters_two_files(local_ca: LocalCA, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "cache" / "tone"
    with serving(local_ca, under("/loras/tone", ADAPTER)) as base:
        assert main(["fetch", f"{base}/loras/tone/", "--dest", str(dest)]) == 0
    assert files_in(dest) == ADAPTER
    assert leftovers(dest.parent) == ["tone"]  # the partial directory was renamed, not copied
    assert str(dest) in capsys.readouterr().err


def test_a_directory_url_without_its_trailing_slash_is_the_same(local_ca: LocalCA, tmp_path: Path) -> None:
    with serving(local_ca, under("/loras/tone", ADAPTER)) as base:
        path = fetch_adapter(f"{base}/loras/tone", tmp_path / "tone")
    assert files_in(path) == ADAPTER


@pytest.mark.parametrize("top", ["", "tone/"])
def test_a_tar_gz_is_unpacked_and_one_top_directory_is_its_contents(
        local_ca: LocalCA, tmp_path: Path, top: str) -> None:
    archive = tar_gz({f"{top}{name}": data for name, data in ADAPTER.items()})
    with serving(local_ca, {"/tone.tar.gz": archive}) as base:
        assert main(["fetch", f"{base}/tone.tar.gz", "--dest", str(tmp_path / "tone")]) == 0
    assert files_in(tmp_path / "tone") == ADAPTER
    assert leftovers(tmp_path) == ["tone"]


def test_without_the_ca_in_ssl_cert_file_the_server_is_refused(
        local_ca: LocalCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SSL_CERT_FILE")
    with serving(local_ca, under("/tone", ADAPTER)) as base:
        assert main(["fetch", f"{base}/tone/", "--dest", str(tmp_path / "tone")]) == 1
        err = capsys.readouterr().err
        assert "TLS verification failed" in err and f"{base}/tone/" in err and "caBundle" in err
        assert leftovers(tmp_path) == []
        monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
        assert main(["fetch", f"{base}/tone/", "--dest", str(tmp_path / "tone")]) == 0
    assert files_in(tmp_path / "tone") == ADAPTER


def test_a_missing_file_exits_1_naming_it_and_leaves_nothing(
        local_ca: LocalCA, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    only_config = under("/tone", {"adapter_config.json": CONFIG})
    with serving(local_ca, only_config) as base:
        assert main(["fetch", f"{base}/tone", "--dest", str(tmp_path / "tone")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"frota fetch: {base}/tone: adapter_model.safetensors: HTTP 404 Not Found"
    assert leftovers(tmp_path) == []


def test_a_body_shorter_than_its_content_length_is_refused(
        local_ca: LocalCA, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = under("/tone", ADAPTER)
    files["/tone/adapter_model.safetensors"] = Truncated(WEIGHTS[:1000], len(WEIGHTS))
    with serving(local_ca, files) as base:
        assert main(["fetch", f"{base}/tone", "--dest", str(tmp_path / "tone")]) == 1
    err = capsys.readouterr().err
    assert "adapter_model.safetensors: truncated" in err and str(len(WEIGHTS)) in err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", "tone/../../evil"])
def test_an_archive_entry_outside_its_directory_is_refused(
        local_ca: LocalCA, tmp_path: Path, name: str) -> None:
    archive = tar_gz({**ADAPTER, name: b"x"})
    dest = tmp_path / "a" / "tone"
    with serving(local_ca, {"/tone.tgz": archive}) as base, \
            pytest.raises(FetchError, match="points outside its directory"):
        fetch_adapter(f"{base}/tone.tgz", dest)
    assert leftovers(dest.parent) == []
    assert not (tmp_path / "evil").exists() and not (tmp_path / "a" / "evil").exists()


def test_a_failed_download_keeps_what_was_at_dest(local_ca: LocalCA, tmp_path: Path) -> None:
    dest = tmp_path / "tone"
    with serving(local_ca, under("/tone", ADAPTER)) as base:
        fetch_adapter(f"{base}/tone", dest)
        with pytest.raises(FetchError, match="HTTP 404"):
            fetch_adapter(f"{base}/gone", dest)
    assert files_in(dest) == ADAPTER and leftovers(tmp_path) == ["tone"]


def test_a_refetch_replaces_dest_whole(local_ca: LocalCA, tmp_path: Path) -> None:
    dest = tmp_path / "tone"
    dest.mkdir()
    (dest / "stale.bin").write_bytes(b"old")
    with serving(local_ca, under("/tone", ADAPTER)) as base:
        fetch_adapter(f"{base}/tone", dest)
    assert files_in(dest) == ADAPTER and leftovers(tmp_path) == ["tone"]


MODEL_FILES = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}', "tokenizer.json": b"{}",
               "tokenizer_config.json": b"{}"}


def test_a_model_directory_fetches_the_hf_layout(local_ca: LocalCA, tmp_path: Path) -> None:
    files = {**MODEL_FILES, "model.safetensors": WEIGHTS}
    with serving(local_ca, under("/m", files)) as base:
        assert main(["fetch", f"{base}/m/", "--dest", str(tmp_path / "m")]) == 0
    assert files_in(tmp_path / "m") == files  # the optional files that 404 are left out


def test_a_sharded_model_fetches_the_shards_its_index_names(local_ca: LocalCA, tmp_path: Path) -> None:
    index = json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors",
                                       "c": "model-1.safetensors"}}).encode()
    files = {**MODEL_FILES, "model.safetensors.index.json": index,
             "model-1.safetensors": b"one", "model-2.safetensors": b"two"}
    with serving(local_ca, under("/m", files)) as base:
        path = fetch_model(f"{base}/m", tmp_path / "m")
    assert files_in(path) == files


def test_a_gguf_url_is_one_file_at_dest(local_ca: LocalCA, tmp_path: Path) -> None:
    with serving(local_ca, {"/w/model.Q4_1.gguf": b"GGUF" + WEIGHTS}) as base:
        assert main(["fetch", f"{base}/w/model.Q4_1.gguf", "--dest",
                     str(tmp_path / "model.Q4_1.gguf")]) == 0
    assert (tmp_path / "model.Q4_1.gguf").read_bytes() == b"GGUF" + WEIGHTS


def test_a_directory_with_neither_layout_says_what_it_must_hold(local_ca: LocalCA, tmp_path: Path) -> None:
    with serving(local_ca, {}) as base, pytest.raises(FetchError, match=r"neither adapter_config\.json nor config\.json"):
        fetch_model(f"{base}/empty/", tmp_path / "m")
    assert leftovers(tmp_path) == []


def test_http_and_other_schemes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fetch", "http://example.com/tone/", "--dest", str(tmp_path / "t")]) == 1
    assert "only https:// and hf://" in capsys.readouterr().err


def test_hf_without_huggingface_hub_names_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    assert main(["fetch", "hf://org/repo", "--dest", str(tmp_path / "org" / "repo")]) == 1
    err = capsys.readouterr().err
    assert "hf://org/repo" in err and "pip install huggingface_hub" in err
    assert leftovers(tmp_path / "org") == []


def test_hf_downloads_through_snapshot_download_into_the_partial_then_dest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def snapshot_download(repo_id: str, local_dir: str, allow_patterns: list[str]) -> str:
        calls.append((repo_id, Path(local_dir).name, allow_patterns))
        for name, data in ADAPTER.items():
            (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(local_dir) / name).write_bytes(data)
        (Path(local_dir) / ".cache").mkdir()
        return local_dir

    monkeypatch.setitem(sys.modules, "huggingface_hub",
                        types.SimpleNamespace(snapshot_download=snapshot_download))
    path = fetch_adapter("hf://org/tone", tmp_path / "tone")
    assert files_in(path) == ADAPTER
    assert calls[0][0] == "org/tone" and calls[0][1].startswith("tone.partial-")
    assert calls[0][2] == ["adapter_config.json", "adapter_model.safetensors"]


def test_what_a_model_fetch_writes_is_what_the_engine_loader_resolves(local_ca: LocalCA, tmp_path: Path) -> None:
    from frota.engine.loader.source import resolve_model

    files = {**MODEL_FILES, "model.safetensors": WEIGHTS}
    with serving(local_ca, {**under("/m", files), "/w/tiny.gguf": b"GGUF"}) as base:
        directory = fetch_model(f"{base}/m/", tmp_path / "m")
        gguf = fetch_model(f"{base}/w/tiny.gguf", tmp_path / "tiny.gguf")
    assert (resolve_model(str(directory)).kind, resolve_model(str(gguf)).kind) == ("safetensors", "gguf")
