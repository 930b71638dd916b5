"""Consistent hashing shared by the prefix-aware and session policies."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator, Sequence

from frota.router.health import Worker


def stable_hash(data: bytes) -> int:
    """A 64-bit hash that is the same in every process (unlike `hash()`), so two
    router replicas send the same key to the same worker."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring with `num_vnodes` points per worker URL.

    Removing a worker moves only the keys it owned; `walk` yields every worker
    once, clockwise from a key, which is what bounded-load hashing needs.
    """

    def __init__(self, urls: Sequence[str], num_vnodes: int = 64) -> None:
        points = sorted(
            (stable_hash(f"{url}#{i}".encode()), url) for url in urls for i in range(num_vnodes))
        self._hashes = [h for h, _ in points]
        self._urls = [u for _, u in points]
        self._num_urls = len(set(urls))

    def walk(self, key: int) -> Iterator[str]:
        if not self._hashes:
            return
        start = bisect.bisect(self._hashes, key)
        seen: set[str] = set()
        n = len(self._urls)
        for i in range(n):
            url = self._urls[(start + i) % n]
            if url not in seen:
                seen.add(url)
                yield url
                if len(seen) == self._num_urls:
                    return


class RingCache:
    """The ring for the current candidate set, rebuilt only when that set changes."""

    def __init__(self, num_vnodes: int = 64) -> None:
        self._num_vnodes = num_vnodes
        self._workers: tuple[Worker, ...] = ()
        self._by_url: dict[str, Worker] = {}
        self._ring = HashRing([], num_vnodes)

    def walk(self, key: int, candidates: Sequence[Worker]) -> Iterator[Worker]:
        workers = tuple(candidates)  # compared by identity: a rediscovered worker is new
        if workers != self._workers:
            urls = [w.url for w in workers]
            if urls != list(self._by_url):
                self._ring = HashRing(urls, self._num_vnodes)
            self._workers, self._by_url = workers, {w.url: w for w in workers}
        by_url = self._by_url
        for url in self._ring.walk(key):
            yield by_url[url]
