"""The model cache verifies what it serves: `fill` records every file's sha256 in the
manifest and enforces a pinned sha256 from the first download; `wait` (every pod start)
checks every file against the manifest and the pin; a mismatch names the file and both
digests. Real files, a real HTTPS server, the real command line."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from frota.api.contract import CacheJob
from frota.cli import cache
from frota.cli.main import main
from frota.engine.loader import cache_manifest
from tests.cli.https_server import LocalCA, serving, tar_gz

GGUF = b"GGUF" + bytes(range(256)) * 64
MODEL = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}', "tokenizer.json": b'{"model": {}}',
         "model.safetensors": bytes(range(256)) * 32}
SERVED = {"/w/m.gguf": GGUF, **{f"/repo/{name}": body for name, body in MODEL.items()},
          "/a/m.tar.gz": tar_gz({f"m/{name}": body for name, body in MODEL.items()})}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(files: dict[str, bytes]) -> str:
    """What `sha256sum` over the sorted files, then sha256 of that, gives: by hand here."""
    lines = "".join(f"{sha256(body)}  {name}\n" for name, body in sorted(files.items()))
    return sha256(lines.encode())


@pytest.fixture(autouse=True)
def trusted(local_ca: LocalCA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    monkeypatch.delenv("HF_TOKEN", raising=False)


@pytest.fixture
def base(local_ca: LocalCA):
    with serving(local_ca, SERVED) as url:
        yield url


def fill(base: str, root: Path, path: str, rel: str, *extra: str) -> int:
    return main(["cache", "fill", f"{base}{path}", "--dest", str(root / rel), "--cache-dir", str(root), *extra])


def wait(root: Path, *extra: str) -> int:
    return main(["cache", "wait", str(root), "--timeout", "0", *extra])


# --- what fill records -------------------------------------------------------------------


def test_fill_records_a_directory_under_the_cache_dir_with_each_files_digest_and_the_directorys(
        base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # hf:// models land at KEY/ORG/REPO: the marker must still be KEY's, where wait looks.
    assert fill(base, tmp_path, "/repo/", "org/repo") == 0
    marker = json.loads((tmp_path / CacheJob.MARKER).read_text())
    assert marker["version"] == 2 and marker["path"] == "org/repo"
    assert marker["files"] == {f"org/repo/{n}": {"size": len(b), "sha256": sha256(b)} for n, b in MODEL.items()}
    assert (marker["sha256"], marker["sha256Of"]) == (tree(MODEL), "directory")
    assert not list(tmp_path.glob("org/.frota-cache.json"))
    # `frota cache digest` prints the same digest, for a user to pin it
    capsys.readouterr()
    assert main(["cache", "digest", str(tmp_path / "org" / "repo")]) == 0
    assert capsys.readouterr().out.strip() == tree(MODEL)
    assert wait(tmp_path, "--sha256", tree(MODEL)) == 0


def test_fill_records_an_archives_own_digest_and_its_unpacked_files(base: str, tmp_path: Path) -> None:
    assert fill(base, tmp_path, "/a/m.tar.gz", "m") == 0
    marker = json.loads((tmp_path / CacheJob.MARKER).read_text())
    assert (marker["sha256"], marker["sha256Of"]) == (sha256(SERVED["/a/m.tar.gz"]), "archive")
    assert set(marker["files"]) == {f"m/{n}" for n in MODEL}
    assert wait(tmp_path, "--sha256", sha256(SERVED["/a/m.tar.gz"])) == 0


# --- a pinned sha256 is enforced from the first download ----------------------------------


@pytest.mark.parametrize(("path", "rel", "right"), [
    ("/w/m.gguf", "m.gguf", sha256(GGUF)),
    ("/repo/", "org/repo", tree(MODEL)),
    ("/a/m.tar.gz", "m", sha256(SERVED["/a/m.tar.gz"])),
], ids=["file", "directory", "archive"])
def test_a_pinned_sha256_is_enforced_at_the_first_download_for_every_layout(
        base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, rel: str, right: str) -> None:
    wrong = "0" * 64
    assert fill(base, tmp_path / "bad", path, rel, "--sha256", wrong) == CacheJob.EXIT_PERMANENT
    err = capsys.readouterr().err
    assert "sha256 mismatch" in err and right in err and wrong in err  # both digests
    assert not (tmp_path / "bad").exists() or not any(p.is_file() for p in (tmp_path / "bad").rglob("*"))
    assert fill(base, tmp_path / "good", path, rel, "--sha256", right) == 0
    assert json.loads((tmp_path / "good" / CacheJob.MARKER).read_text())["checked"] == ["content-length", "sha256"]


def test_the_pin_and_the_urls_fragment_must_agree(base: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert fill(base, tmp_path, f"/w/m.gguf#sha256={sha256(GGUF)}", "m.gguf",
                "--sha256", "1" * 64) == CacheJob.EXIT_PERMANENT
    assert "disagree" in capsys.readouterr().err
    assert not (tmp_path / "m.gguf").exists()


def test_a_network_error_on_a_url_with_a_sha256_fragment_is_retried_not_permanent(
        base: str, tmp_path: Path) -> None:
    # The URI (in every message) carries "sha256": that alone must not make a 404 permanent.
    assert fill(base, tmp_path, f"/w/missing.gguf#sha256={'a' * 64}", "m.gguf") == 1


# --- wait checks the files at every pod start ---------------------------------------------


def test_wait_refuses_a_file_changed_in_place_naming_it_and_both_digests(
        base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setattr(cache, "TERMINATION_LOG", str(log))
    root = tmp_path / "key"
    assert fill(base, root, "/repo/", "org/repo") == 0
    weights = root / "org" / "repo" / "model.safetensors"
    changed = bytearray(weights.read_bytes())
    changed[1000] ^= 1  # one bit, same size
    weights.write_bytes(bytes(changed))
    capsys.readouterr()
    assert wait(root) == CacheJob.EXIT_PERMANENT
    err = capsys.readouterr().err
    for says in (str(weights), sha256(bytes(changed)), sha256(MODEL["model.safetensors"])):
        assert says in err
    assert str(weights) in log.read_text() and sha256(bytes(changed)) in log.read_text()


@pytest.mark.parametrize("change", ["truncated", "removed", "added", "link", "replaced by a link",
                                    "a linked directory"])
def test_wait_refuses_a_cache_whose_files_are_not_the_manifests(
        base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str) -> None:
    assert fill(base, tmp_path, "/repo/", "org/repo") == 0
    model = tmp_path / "org" / "repo"
    outside = tmp_path.parent / f"{tmp_path.name}-outside.safetensors"
    outside.write_bytes(MODEL["model.safetensors"])  # the same bytes: only the link is wrong
    if change == "truncated":
        (model / "model.safetensors").write_bytes(MODEL["model.safetensors"][:100])
    elif change == "removed":
        (model / "tokenizer.json").unlink()
    elif change == "added":  # the loader reads every *.safetensors of the directory
        (model / "extra.safetensors").write_bytes(b"x")
    elif change == "link":
        (model / "other.safetensors").symlink_to(outside)
    elif change == "replaced by a link":
        (model / "model.safetensors").unlink()
        (model / "model.safetensors").symlink_to(outside)
    else:  # the same files, but reached through a link to a directory outside the cache
        elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
        (tmp_path / "org").rename(elsewhere)
        (tmp_path / "org").symlink_to(elsewhere)
    capsys.readouterr()
    assert wait(tmp_path) == CacheJob.EXIT_PERMANENT
    named = tmp_path / "org" if change == "a linked directory" else model
    assert f"wait: {named}" in capsys.readouterr().err


def test_wait_with_a_pin_refuses_a_cache_of_another_source(base: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert fill(base, tmp_path, "/w/m.gguf", "m.gguf") == 0
    other = "ab" * 32
    capsys.readouterr()
    assert wait(tmp_path, "--sha256", other) == CacheJob.EXIT_PERMANENT
    err = capsys.readouterr().err
    assert other in err and sha256(GGUF) in err and "m.gguf" in err
    assert wait(tmp_path, "--sha256", sha256(GGUF)) == 0


def test_a_pin_is_checked_against_the_files_not_only_the_manifest(base: str, tmp_path: Path) -> None:
    """The manifest sits on the same volume: rewriting it with the file does not pass a pin."""
    assert fill(base, tmp_path, "/w/m.gguf", "m.gguf", "--sha256", sha256(GGUF)) == 0
    forged = b"GGUF" + b"\0" * 100
    (tmp_path / "m.gguf").write_bytes(forged)
    marker = json.loads((tmp_path / CacheJob.MARKER).read_text())
    marker["files"]["m.gguf"] = {"size": len(forged), "sha256": sha256(forged)}
    (tmp_path / CacheJob.MARKER).write_text(json.dumps(marker))
    assert wait(tmp_path) == 0  # trust on first use cannot tell...
    assert wait(tmp_path, "--sha256", sha256(GGUF)) == CacheJob.EXIT_PERMANENT  # ...the pin can


@pytest.mark.parametrize("files", [
    None,  # written by something that records nothing
    {"../outside": {"size": 1, "sha256": "a" * 64}},
    {"/etc/hostname": {"size": 1, "sha256": "a" * 64}},
    {"m.gguf": {"size": "big", "sha256": "a" * 64}},
    {"m.gguf": {"size": 1, "sha256": "not hex"}},
], ids=["no files", "dot-dot", "absolute", "size", "digest"])
def test_wait_refuses_a_manifest_that_is_not_one(tmp_path: Path, files: dict | None) -> None:
    (tmp_path / "m.gguf").write_bytes(b"x")
    body = {"version": 2, "uri": "https://h/m.gguf", "path": "m.gguf"}
    if files is not None:
        body["files"] = files
    (tmp_path / CacheJob.MARKER).write_text(json.dumps(body))
    assert wait(tmp_path) == CacheJob.EXIT_PERMANENT


def test_wait_refuses_a_marker_that_stays_unreadable_past_its_timeout(tmp_path: Path) -> None:
    (tmp_path / CacheJob.MARKER).write_bytes(b'{"uri": "x", "fi\xff')
    assert wait(tmp_path) == CacheJob.EXIT_PERMANENT


def test_a_manifest_an_earlier_frota_wrote_is_still_checked(base: str, tmp_path: Path) -> None:
    """Version 1 named a directory's files relative to the directory itself."""
    assert fill(base, tmp_path, "/a/m.tar.gz", "m") == 0
    marker = json.loads((tmp_path / CacheJob.MARKER).read_text())
    legacy = {"uri": marker["uri"], "path": "m", "checked": ["content-length"], "bytes": marker["bytes"],
              "files": {n.removeprefix("m/"): f for n, f in marker["files"].items()}}
    (tmp_path / CacheJob.MARKER).write_text(json.dumps(legacy))
    assert wait(tmp_path) == 0
    (tmp_path / "m" / "config.json").write_bytes(b"{}")
    assert wait(tmp_path) == CacheJob.EXIT_PERMANENT


def test_fill_removes_the_marker_an_earlier_frota_left_beside_org_repo(base: str, tmp_path: Path) -> None:
    """It sat nearer the model than the KEY directory's, where the loader would take it."""
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / CacheJob.MARKER).write_text(json.dumps({"uri": "old", "path": "repo", "files": {}}))
    assert fill(base, tmp_path, "/repo/", "org/repo") == 0
    assert not (tmp_path / "org" / CacheJob.MARKER).exists()
    manifest = cache_manifest.verify_model(str(tmp_path / "org" / "repo"))
    assert manifest is not None and manifest.path == "org/repo"


# --- a refill replaces a cache that fails its check ----------------------------------------


def test_a_recreated_job_downloads_again_a_cache_that_fails_its_check(base: str, tmp_path: Path) -> None:
    assert fill(base, tmp_path, "/w/m.gguf", "m.gguf") == 0
    (tmp_path / "m.gguf").write_bytes(b"GGUF rotten")
    assert wait(tmp_path) == CacheJob.EXIT_PERMANENT
    assert fill(base, tmp_path, "/w/m.gguf", "m.gguf") == 0
    assert (tmp_path / "m.gguf").read_bytes() == GGUF
    assert wait(tmp_path) == 0


# --- durability ------------------------------------------------------------------------


def test_every_file_and_the_manifest_are_fsynced_before_the_rename_that_publishes_them(
        base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, ...]] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str, dst: str, *args, **kwargs) -> None:
        events.append(("rename", os.fspath(src), os.fspath(dst)))
        real_rename(src, dst, *args, **kwargs)

    def replace(src: str, dst: str, *args, **kwargs) -> None:
        events.append(("rename", os.fspath(src), os.fspath(dst)))
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    root = tmp_path.resolve()
    assert fill(base, root, "/repo/", "org/repo") == 0

    def published(dst: Path) -> int:
        return next(i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(dst))

    download = published(root / "org" / "repo")
    partial = events[download][1]
    synced = {e[1] for e in events[:download] if e[0] == "fsync"}
    assert {f"{partial}/{name}" for name in MODEL} | {partial} <= synced
    assert ("fsync", str(root / "org")) in events[download:]  # the rename itself
    marker = published(root / CacheJob.MARKER)
    assert ("fsync", events[marker][1]) in events[download:marker]
    assert ("fsync", str(root)) in events[marker:]
    assert download < marker


# --- frota fetch (a pod's own download, without the cache) -------------------------------


def test_fetch_enforces_a_pinned_sha256_and_refuses_a_malformed_one(
        base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fetch", f"{base}/repo/", "--dest", str(tmp_path / "bad"), "--kind", "model",
                 "--sha256", "0" * 64]) == 1
    assert tree(MODEL) in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["fetch", f"{base}/repo/", "--dest", str(tmp_path / "good"), "--kind", "model",
                 "--sha256", tree(MODEL)]) == 0
    with pytest.raises(SystemExit):  # argparse: not 64 lowercase hex digits
        main(["fetch", f"{base}/w/m.gguf", "--dest", str(tmp_path / "x"), "--sha256", "ABC"])


def test_a_download_holding_a_link_is_refused(local_ca: LocalCA, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The archive check refuses links; this is the digest walk's own, for what hf:// writes."""
    from frota.engine.loader.digests import RefusedFile, regular_files

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "link").symlink_to("/etc/hostname")
    with pytest.raises(RefusedFile):
        regular_files(tmp_path / "d")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("m/config.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/hostname"
        tar.addfile(info)
    with serving(local_ca, {"/l.tar.gz": out.getvalue()}) as url:
        assert main(["cache", "fill", f"{url}/l.tar.gz", "--dest", str(tmp_path / "k" / "m")]) == 1
    assert cache_manifest.read(tmp_path / "k") is None


def test_a_directorys_digest_is_what_sha256sum_gives_without_frota(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/operations.md gives the shell line; a user pins with it."""
    import shutil
    import subprocess

    if not all(shutil.which(tool) for tool in ("find", "sort", "xargs", "sha256sum")):
        pytest.skip("needs find, sort, xargs and sha256sum")
    for name, body in {"config.json": b"{}", "sub/w.safetensors": b"w" * 9, "Z.json": b"z", "é.txt": b"e"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)
    line = "find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum"
    shell = subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60)
    assert main(["cache", "digest", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == shell.stdout.split()[:1]
