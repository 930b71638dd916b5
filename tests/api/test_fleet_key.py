"""The fleet key: credentials and handle signatures, and what a rotation keeps accepting."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from frota.api.fleet_key import (
    MIN_KEY_CHARS,
    FleetKeyError,
    Keyring,
    generate_key,
    write_key_file,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


HANDLE = {"url": "http://10.0.0.7:8001", "id": "kv-1", "fingerprint": "ab12",
          "prompt_digest": "cd34", "num_prompt_tokens": 300, "first_token": 42,
          "adapter": None, "expires_at": 1765000000.5}


def test_a_written_key_file_is_private_and_long_enough(tmp_path: Path) -> None:
    path = write_key_file(tmp_path / "key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(path.read_text().strip()) == 64
    assert generate_key() != generate_key()


@pytest.mark.parametrize("content", ["", "short", "x" * (MIN_KEY_CHARS - 1)])
def test_a_missing_or_short_key_is_refused_naming_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "key"
    path.write_text(content)
    with pytest.raises(FleetKeyError, match=str(path)):
        Keyring.from_file(path)
    with pytest.raises(FleetKeyError, match="cannot read"):
        Keyring.from_file(tmp_path / "absent")


def test_a_signed_handle_verifies_and_any_changed_field_does_not() -> None:
    ring = Keyring(generate_key().encode())
    signed = ring.sign(HANDLE)
    assert ring.verify(signed)
    for field, value in [("url", "http://127.0.0.1:9/"), ("id", "kv-2"), ("fingerprint", "x"),
                         ("prompt_digest", "y"), ("first_token", 43), ("adapter", "sql"),
                         ("expires_at", 1765000999.0), ("num_prompt_tokens", 1)]:
        assert not ring.verify({**signed, field: value}), field
    assert not ring.verify({**signed, "extra": 1})  # a field added is a field changed
    unsigned = dict(signed)
    del unsigned["sig"]
    assert not ring.verify(unsigned)
    assert not ring.verify({**signed, "sig": 7})


def test_another_fleets_key_verifies_nothing_and_its_credential_is_refused() -> None:
    ours, theirs = Keyring(generate_key().encode()), Keyring(generate_key().encode())
    assert not ours.verify(theirs.sign(HANDLE))
    assert ours.accepts_authorization(f"Bearer {ours.credential}")
    assert ours.accepts_authorization(f"bearer {ours.credential}")
    for value in (None, "", ours.credential, f"Bearer {theirs.credential}", "Bearer ",
                  f"Basic {ours.credential}"):
        assert not ours.accepts_authorization(value), value


def test_the_credential_is_not_a_signature_and_not_the_key() -> None:
    key = generate_key()
    ring = Keyring(key.encode())
    assert key not in ring.credential
    assert ring.credential != ring.sign({})["sig"]


def test_after_a_rotation_the_old_key_is_accepted_for_the_grace_only(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "key"
    path.write_text(generate_key())
    ring = Keyring.from_file(path, grace_s=30, clock=clock)
    old_handle, old_credential = ring.sign(HANDLE), ring.credential
    path.write_text(generate_key())  # the Secret rotated; the kubelet rewrote the file
    clock.now += 1.5  # past the re-read interval
    new_handle = ring.sign(HANDLE)
    assert new_handle["sig"] != old_handle["sig"]
    assert ring.verify(old_handle) and ring.verify(new_handle)
    assert ring.accepts_authorization(f"Bearer {old_credential}")
    clock.now += 30
    assert not ring.verify(old_handle)
    assert not ring.accepts_authorization(f"Bearer {old_credential}")
    assert ring.verify(new_handle)


def test_a_rotation_is_seen_at_once_when_a_peer_already_signs_with_the_new_key(
        tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "key"
    path.write_text(generate_key())
    ring = Keyring.from_file(path, clock=clock)
    new_key = generate_key()
    path.write_text(new_key)  # within the re-read interval: not read yet
    peer = Keyring(new_key.encode())
    assert ring.verify(peer.sign(HANDLE))


def test_a_bad_key_written_mid_rotation_keeps_the_key_in_hand(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "key"
    path.write_text(generate_key())
    ring = Keyring.from_file(path, clock=clock)
    handle = ring.sign(HANDLE)
    path.write_text("")
    clock.now += 5
    assert ring.verify(handle)
    path.unlink()
    clock.now += 5
    assert ring.verify(handle)
