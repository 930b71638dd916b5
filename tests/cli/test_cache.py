"""`frota cache fill` and `frota cache wait` (spec.model.cache), and the fetch guarantees
the cache relies on: a #sha256= fragment is checked, a killed run's partials are removed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from frota.api.contract import CacheJob
from frota.cli import cache
from frota.cli.main import main
from frota.server.fetch import FetchError, fetch_model, partial_path
from tests.cli.https_server import LocalCA, Stalled, serving

GGUF = b"GGUF" + bytes(range(256)) * 32
SHA = hashlib.sha256(GGUF).hexdigest()


@pytest.fixture(autouse=True)
def trusted(local_ca: LocalCA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    monkeypatch.delenv("HF_TOKEN", raising=False)


def test_a_matching_sha256_fragment_is_checked_and_the_fragment_never_sent(
        local_ca: LocalCA, tmp_path: Path) -> None:
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        path = fetch_model(f"{base}/w/m.gguf#sha256={SHA.upper()}", tmp_path / "m.gguf")
    assert path.read_bytes() == GGUF


def test_a_sha256_mismatch_is_an_error_and_leaves_nothing(local_ca: LocalCA, tmp_path: Path) -> None:
    wrong = "0" * 64
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base, pytest.raises(FetchError, match="sha256 mismatch"):
        fetch_model(f"{base}/w/m.gguf#sha256={wrong}", tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fragment", ["sha256=abc", "sha256=" + "g" * 64])
def test_a_malformed_sha256_fragment_is_refused(local_ca: LocalCA, tmp_path: Path, fragment: str) -> None:
    with pytest.raises(FetchError, match="64 hex digits"):
        fetch_model(f"https://example.invalid/m.gguf#{fragment}", tmp_path / "m.gguf")


def test_a_sha256_fragment_on_a_directory_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="checks one file"):
        fetch_model(f"https://example.invalid/model/#sha256={SHA}", tmp_path / "m")


def test_partials_a_killed_run_left_are_removed_and_never_loaded(local_ca: LocalCA, tmp_path: Path) -> None:
    # A Job pod killed mid-download leaves DEST.partial-PID (another pid than this run's).
    stale = tmp_path / "m.gguf.partial-4242"
    stale.mkdir()
    (stale / "half").write_bytes(b"half a file")
    (tmp_path / "m.gguf.partial-7").write_bytes(b"half")
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        fetch_model(f"{base}/w/m.gguf", tmp_path / "m.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
    assert (tmp_path / "m.gguf").read_bytes() == GGUF


def test_two_writers_of_one_file_never_share_a_partial(tmp_path: Path) -> None:
    # In containers every fill is often pid 1: the name must differ between pods too.
    first, second = partial_path(tmp_path / "m.gguf"), partial_path(tmp_path / "m.gguf")
    assert first != second
    assert first.name.startswith(f"m.gguf.partial-{os.getpid()}-")


def test_fill_stops_at_once_on_sigterm_and_leaves_nothing(local_ca: LocalCA, tmp_path: Path) -> None:
    """A deleted Job pod: `fill` (pid 1 there, which the kernel spares an unhandled SIGTERM)
    stops mid-download instead of running on for the grace period, and removes its partial."""
    dest = tmp_path / "key" / "m.gguf"
    with serving(local_ca, {"/w/m.gguf": Stalled(GGUF[:4096], len(GGUF))}) as base:
        proc = subprocess.Popen(
            [sys.executable, "-m", "frota.cli.main", "cache", "fill", f"{base}/w/m.gguf",
             "--dest", str(dest)], env={**os.environ, "SSL_CERT_FILE": str(local_ca.ca_cert)},
            stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not list(dest.parent.glob("m.gguf.partial-*")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err
    assert list(dest.parent.iterdir()) == []  # no partial, no file, no marker


def test_fill_downloads_then_writes_the_marker_with_each_files_size_and_sha256(
        local_ca: LocalCA, tmp_path: Path) -> None:
    dest = tmp_path / "key" / "m.gguf"
    uri_path = f"/w/m.gguf#sha256={SHA}"
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        assert main(["cache", "fill", base + uri_path, "--dest", str(dest)]) == 0
    marker = json.loads((tmp_path / "key" / CacheJob.MARKER).read_text())
    assert marker["uri"] == base + uri_path
    assert marker["files"] == {"m.gguf": {"size": len(GGUF), "sha256": SHA}}
    assert marker["bytes"] == len(GGUF)
    assert marker["checked"] == ["content-length", "sha256"]
    assert marker["completedAt"].endswith("Z")
    assert sorted(p.name for p in dest.parent.iterdir()) == [CacheJob.MARKER, "m.gguf"]


def test_fill_of_a_failing_download_writes_no_marker(local_ca: LocalCA, tmp_path: Path) -> None:
    with serving(local_ca, {}) as base:
        assert main(["cache", "fill", f"{base}/w/m.gguf", "--dest", str(tmp_path / "k" / "m.gguf")]) == 1
    assert not (tmp_path / "k" / CacheJob.MARKER).exists()


def test_fill_finds_the_work_done_when_the_marker_names_the_uri_and_the_files_match_it(
        local_ca: LocalCA, tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        assert main(["cache", "fill", f"{base}/w/m.gguf", "--dest", str(dest)]) == 0
    written = (tmp_path / CacheJob.MARKER).stat().st_mtime_ns
    # No server now: a second download would fail.
    assert main(["cache", "fill", f"{base}/w/m.gguf", "--dest", str(dest)]) == 0
    assert (tmp_path / CacheJob.MARKER).stat().st_mtime_ns == written and dest.read_bytes() == GGUF


def test_wait_returns_at_once_when_the_marker_is_there_and_the_files_match_it(
        local_ca: LocalCA, tmp_path: Path) -> None:
    with serving(local_ca, {"/w/m.gguf": GGUF}) as base:
        assert main(["cache", "fill", f"{base}/w/m.gguf", "--dest", str(tmp_path / "m.gguf")]) == 0
    assert main(["cache", "wait", str(tmp_path), "--timeout", "0"]) == 0


def test_wait_fails_after_its_timeout_without_a_marker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.gguf.partial-1").write_bytes(b"half")  # a download under way is not enough
    started = time.monotonic()
    assert main(["cache", "wait", str(tmp_path), "--timeout", "0.3"]) == 1
    assert 0.3 <= time.monotonic() - started < 5
    assert "model-cache Job" in capsys.readouterr().err


def test_wait_ignores_a_half_written_marker_and_returns_once_it_is_whole(tmp_path: Path) -> None:
    (tmp_path / CacheJob.MARKER).write_text('{"uri": ')  # not the Job's (it renames), but be safe
    timer = threading.Timer(0.2, lambda: (tmp_path / CacheJob.MARKER).write_text('{"uri": "x"}'))
    timer.start()
    try:
        assert cache.wait_for_marker(tmp_path, timeout=5, poll=0.05) == {"uri": "x"}
    finally:
        timer.cancel()


def test_fill_of_a_sha256_mismatch_exits_permanent_and_a_truncated_body_retryable(
        local_ca: LocalCA, tmp_path: Path) -> None:
    from tests.cli.https_server import Truncated

    with serving(local_ca, {"/w/m.gguf": GGUF, "/w/t.gguf": Truncated(GGUF[:100], len(GGUF))}) as base:
        assert main(["cache", "fill", f"{base}/w/m.gguf#sha256={'0' * 64}",
                     "--dest", str(tmp_path / "a" / "m.gguf")]) == CacheJob.EXIT_PERMANENT
        assert main(["cache", "fill", f"{base}/w/t.gguf", "--dest", str(tmp_path / "b" / "t.gguf")]) == 1
    assert cache.read_marker(tmp_path / "a") is None and cache.read_marker(tmp_path / "b") is None
