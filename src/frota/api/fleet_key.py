"""The fleet key: what a fleet's own parts prove themselves to each other with.

One secret per fleet (`contract.FleetKey`: a Secret the operator owns, mounted into the
fleet's worker and router pods; a file `frota up` writes per run) gives two things:

- **The internal credential**, `Authorization: Bearer <credential>`, on every call to a
  worker's internal endpoints (the KV block stream, `/internal/*`, adapter loads). It is
  an HMAC of a fixed label under the key, so the key itself never travels.
- **Signatures of KV handles.** A prefill worker signs each handle it gives out (HMAC-SHA256
  over the handle's canonical JSON, its expiry included); a decode worker checks the
  signature and the expiry before it does anything else with a handle, so a handle that a
  client made up never makes a worker connect anywhere.

A rotation is a new key written into the file (the kubelet refreshes a mounted Secret
within about a minute, pod by pod). `Keyring` re-reads the file at most once a second when
asked, and at once when something fails to verify; the key it replaced is still accepted
for `grace_s` seconds (one KV-handle TTL), so handles signed just before the rotation, and
peers that have not seen the new key yet, keep working through it.

Standard library only: the router, the workers and `frota up` all read it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

MIN_KEY_CHARS = 32  # a key shorter than this is refused: 128 bits of hex at the least
REREAD_INTERVAL_S = 1.0
SIGNATURE_FIELD = "sig"
# Labels that keep the two uses of one key apart (a signature is never a credential).
_CREDENTIAL_LABEL = b"frota/internal-credential/v1"
_HANDLE_LABEL = b"frota/kv-handle/v1\n"


class FleetKeyError(ValueError):
    """The key file is missing, unreadable or too short."""


def generate_key() -> str:
    """A new key: 32 random bytes as 64 hex characters (what the operator writes too)."""
    return secrets.token_hex(32)


def write_key_file(path: str | os.PathLike[str]) -> Path:
    """Write a new key to `path`, readable by its owner only; returns the path."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(generate_key() + "\n")
    return path


def read_key(path: str | os.PathLike[str]) -> bytes:
    """The key in the file at `path` (surrounding whitespace dropped)."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetKeyError(f"cannot read the fleet key file {path}: {exc}") from exc
    if len(text) < MIN_KEY_CHARS:
        raise FleetKeyError(f"the fleet key in {path} is shorter than {MIN_KEY_CHARS} "
                            "characters; write a random one (`openssl rand -hex 32`)")
    return text.encode()


def canonical(fields: Mapping[str, Any]) -> bytes:
    """The bytes a handle's signature covers: its fields but the signature, as compact JSON
    with sorted keys (what a JSON round trip between the workers keeps unchanged)."""
    unsigned = {k: v for k, v in fields.items() if k != SIGNATURE_FIELD}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()


class Keyring:
    """The fleet's current key, and the keys it replaced within their grace."""

    def __init__(self, key: bytes, *, path: str | os.PathLike[str] | None = None,
                 grace_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path) if path is not None else None
        self.grace_s = grace_s
        self._clock = clock
        self._key = key
        self._credential = _credential(key)
        self._retired: list[tuple[bytes, float]] = []  # (key, accepted until)
        self._next_read = clock() + REREAD_INTERVAL_S

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, grace_s: float = 30.0,
                  clock: Callable[[], float] = time.monotonic) -> Keyring:
        """The keyring of the key file at `path`; FleetKeyError when it cannot be used."""
        return cls(read_key(path), path=path, grace_s=grace_s, clock=clock)

    # -- the credential ------------------------------------------------------------

    @property
    def credential(self) -> str:
        """The bearer token of internal calls, under the current key."""
        self.refresh()
        return self._credential

    def authorization(self) -> tuple[str, str]:
        """The header an internal call carries."""
        return ("Authorization", f"Bearer {self.credential}")

    def accepts_authorization(self, value: str | None) -> bool:
        """Whether an `Authorization` header's value carries the fleet's credential (under
        the current key, or one replaced less than `grace_s` ago)."""
        if not value or value[:7].lower() != "bearer ":
            return False
        token = value[7:].strip().encode()
        return self._accepted(lambda key: hmac.compare_digest(token, _credential(key).encode()))

    # -- KV handles ------------------------------------------------------------------

    def sign(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """`fields` with their signature under the current key added."""
        self.refresh()
        return {**fields, SIGNATURE_FIELD: _signature(self._key, canonical(fields))}

    def verify(self, fields: Mapping[str, Any]) -> bool:
        """Whether `fields` carry a signature made with the fleet's key (current, or
        replaced within the grace). Says nothing of expiry: the handle's reader checks it."""
        given = fields.get(SIGNATURE_FIELD)
        if not isinstance(given, str):
            return False
        payload = canonical(fields)
        return self._accepted(
            lambda key: hmac.compare_digest(given, _signature(key, payload)))

    # -- rotation --------------------------------------------------------------------

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the key file (at most once a second unless `force`); True when the key
        changed. A file that cannot be read, or holds a bad key, leaves the key as it was."""
        now = self._clock()
        if self.path is None or (not force and now < self._next_read):
            return False
        self._next_read = now + REREAD_INTERVAL_S
        try:
            key = read_key(self.path)
        except FleetKeyError:
            return False  # mid-rotation or removed: the key in hand stays good
        if key == self._key:
            return False
        self._retired = [(k, until) for k, until in self._retired if until > now and k != key]
        self._retired.append((self._key, now + self.grace_s))
        self._key, self._credential = key, _credential(key)
        return True

    def _accepted(self, matches: Callable[[bytes], bool]) -> bool:
        """Whether `matches` holds for an accepted key; on a miss, the file is read again at
        once (this pod may not have seen a rotation its peer has)."""
        self.refresh()
        for attempt in range(2):
            now = self._clock()
            if matches(self._key) or any(matches(k) for k, until in self._retired if until > now):
                return True
            if attempt == 0 and not self.refresh(force=True):
                return False
        return False


def _credential(key: bytes) -> str:
    return hmac.new(key, _CREDENTIAL_LABEL, hashlib.sha256).hexdigest()


def _signature(key: bytes, payload: bytes) -> str:
    return hmac.new(key, _HANDLE_LABEL + payload, hashlib.sha256).hexdigest()
