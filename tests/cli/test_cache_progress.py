"""`frota cache fill --progress-port`: GET /progress answers the bytes written so far
(the partial a running download writes) and the source's Content-Length."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from frota.cli import cache
from tests.cli.https_server import LocalCA, serving

GGUF = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture(autouse=True)
def trusted(local_ca: LocalCA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    monkeypatch.delenv("HF_TOKEN", raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def progress(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=5) as response:
        return json.loads(response.read())


def test_bytes_are_the_partials_on_disk_file_or_directory_then_the_renamed_download(tmp_path: Path) -> None:
    dest = tmp_path / "key" / "model"
    dest.parent.mkdir()
    assert cache.downloaded_bytes(dest) == 0
    (dest.parent / "model.partial-7").mkdir()
    (dest.parent / "model.partial-7" / "a.safetensors").write_bytes(b"x" * 300)
    (dest.parent / "other.partial-7").write_bytes(b"y" * 50)  # another name's: not ours
    assert cache.downloaded_bytes(dest) == 300
    (dest.parent / "model.partial-7").rename(dest)
    assert cache.downloaded_bytes(dest) == 300


def test_the_total_is_the_single_files_content_length_and_unknown_for_a_directory(local_ca: LocalCA) -> None:
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        assert cache.announced_bytes(f"{base}/w/m.gguf#sha256={'0' * 64}") == len(GGUF)
        assert cache.announced_bytes(f"{base}/w/missing.gguf") is None
        assert cache.announced_bytes(f"{base}/w") is None  # a directory: many files
    assert cache.announced_bytes("hf://org/repo") is None


def test_progress_answers_while_the_download_runs_and_stops_with_it(local_ca: LocalCA, tmp_path: Path) -> None:
    dest = tmp_path / "key" / "m.gguf"
    dest.parent.mkdir()
    (dest.parent / "m.gguf.partial-1").write_bytes(GGUF[:1000])
    port = free_port()
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        server = cache.serve_progress(dest, f"{base}/w/m.gguf", port, host="127.0.0.1")
        try:
            body = progress(port)
            assert body["bytes"] == 1000
            for _ in range(100):  # the total is asked for beside the download
                if body["totalBytes"] is not None:
                    break
                time.sleep(0.05)
                body = progress(port)
            assert body == {"bytes": 1000, "totalBytes": len(GGUF)}
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
        finally:
            server.shutdown()
            server.server_close()
    with pytest.raises(urllib.error.URLError):
        progress(port)


def test_fill_with_a_progress_port_downloads_and_closes_the_port(local_ca: LocalCA, tmp_path: Path) -> None:
    from frota.cli.main import main

    dest = tmp_path / "key" / "m.gguf"
    port = free_port()
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        assert main(["cache", "fill", f"{base}/w/m.gguf", "--dest", str(dest),
                     "--progress-port", str(port)]) == 0
    assert dest.read_bytes() == GGUF
    with pytest.raises(urllib.error.URLError):
        progress(port)
