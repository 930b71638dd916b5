"""Every load of a cached model checks the cache against its manifest first: a worker
container restarted in its pod runs no init container, so the loader is the last check
between the volume and what is served. The real SmolLM2 file, downloaded over real HTTPS
by the real `frota cache fill`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from frota.cli.main import main
from frota.engine.loader import load_model, resolve_model
from frota.engine.loader.cache_manifest import MARKER, CacheIntegrityError, verify_model
from tests.cli.https_server import LocalCA, make_ca, serving


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def cached_gguf(local_ca: LocalCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A cache directory as the Job leaves it for SmolLM2 (pinned), and the file's sha256."""
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    body = Path(resolve_model("smollm2").path).read_bytes()
    digest = hashlib.sha256(body).hexdigest()
    with serving(local_ca, {"/m/smollm2.gguf": body}) as base:
        assert main(["cache", "fill", f"{base}/m/smollm2.gguf", "--dest", str(tmp_path / "key" / "smollm2.gguf"),
                     "--cache-dir", str(tmp_path / "key"), "--sha256", digest]) == 0
    assert main(["cache", "wait", str(tmp_path / "key"), "--timeout", "0", "--sha256", digest]) == 0
    return tmp_path / "key" / "smollm2.gguf", digest


@pytest.mark.slow
def test_a_cached_model_that_matches_its_manifest_loads(cached_gguf: tuple[Path, str]) -> None:
    path, _ = cached_gguf
    model, cfg, tokenizer = load_model(str(path), torch.float32, torch.device("cpu"), verbose=False)
    assert cfg.vocab_size == 49152 and tokenizer.encode("hello")
    assert sum(p.numel() for p in model.parameters()) > 100_000_000  # all of SmolLM2-135M


def test_a_cached_model_changed_since_the_download_is_not_loaded(cached_gguf: tuple[Path, str]) -> None:
    path, digest = cached_gguf
    with path.open("r+b") as f:  # one byte deep in the weights, the size unchanged
        f.seek(50_000_000)
        byte = f.read(1)
        f.seek(50_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    changed = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(CacheIntegrityError) as info:
        load_model(str(path), torch.float32, torch.device("cpu"), verbose=False)
    assert str(path) in str(info.value) and digest in str(info.value) and changed in str(info.value)


def test_a_file_dropped_beside_a_cached_model_is_not_loaded(tmp_path: Path) -> None:
    """The safetensors loader reads every *.safetensors of its directory: one the download
    did not write must not be served."""
    model = tmp_path / "key" / "org" / "repo"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 8)
    record = {n: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
              for n, p in (("org/repo/config.json", model / "config.json"),
                           ("org/repo/model.safetensors", model / "model.safetensors"))}
    (tmp_path / "key" / MARKER).write_text(json.dumps({"version": 2, "path": "org/repo", "files": record}))
    assert verify_model(str(model)) is not None
    (model / "model-00002.safetensors").write_bytes(b"\0" * 8)
    with pytest.raises(CacheIntegrityError, match="not in the cache's manifest"):
        load_model(str(model), torch.float32, torch.device("cpu"), verbose=False)


def test_a_model_in_a_cache_directory_its_manifest_does_not_cover_is_not_loaded(
        cached_gguf: tuple[Path, str]) -> None:
    path, _ = cached_gguf
    stray = path.parent / "other"
    stray.mkdir()
    shutil.copy(path, stray / "other.gguf")
    with pytest.raises(CacheIntegrityError, match="not what its manifest records"):
        verify_model(str(stray / "other.gguf"))


def test_models_outside_any_cache_are_loaded_unchecked(tmp_path: Path) -> None:
    assert verify_model("smollm2") is None and verify_model("synthetic:dense-tiny") is None
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert verify_model(str(tmp_path / "m.gguf")) is None
