"""`prefix-aware`: requests that share a prompt prefix go where that prefix is cached."""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from frota.router.health import Worker
from frota.router.policies.base import Decision, PolicyName, RouteRequest, RoutingPolicy
from frota.router.policies.ring import RingCache


def adapter_seed(adapter: str | None) -> bytes:
    """The start of an adapter's hash chain: KV computed under one adapter never serves
    another (the workers' prefix caches are keyed the same way), so neither is affinity.
    Eight bytes, like every later link, so no adapter's chain can match the base's."""
    if adapter is None:
        return b""
    return hashlib.blake2b(b"adapter\0" + adapter.encode(), digest_size=8).digest()


def prefix_block_hashes(text: str, block_chars: int, max_blocks: int,
                        seed: bytes = b"") -> list[int]:
    """Chained hashes of the leading `block_chars`-character blocks of `text`.

    Hash i covers characters [0, (i+1) * block_chars), so two prompts share hash
    i exactly when they share that whole prefix. The router has no tokenizer,
    so blocks are characters, not tokens; a trailing partial block is hashed
    too, so short prompts still have a key. `seed` starts the chain
    (`adapter_seed`).
    """
    hashes: list[int] = []
    digest = seed
    data = text.encode("utf-8", "surrogatepass")
    step = block_chars  # bytes; equal to characters for ASCII, close enough otherwise
    for start in range(0, min(len(data), step * max_blocks), step):
        digest = hashlib.blake2b(digest + data[start:start + step], digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "big"))
    return hashes


@dataclass(frozen=True)
class PrefixAwareConfig:
    """The prefix-aware policy's settings; the `--prefix-*` flags take their defaults
    from here (see `PrefixAwarePolicy` for what each one does)."""

    block_chars: int = 128       # --prefix-block-chars: characters per hashed block
    max_blocks: int = 64         # --prefix-max-blocks: leading blocks hashed per prompt
    balance: float = 0.25        # --prefix-balance: up to (1 + this) x the fair share
    balance_abs: int = 8         # --prefix-balance-abs: or this many over the least loaded
    hot_window: int = 64         # --prefix-hot-window: latest requests a hot prefix is seen in
    min_match: float = 0.5       # --prefix-min-match: share of the blocks a prefix must cover
    max_table_entries: int = 200_000  # block hashes remembered (LRU)

    def check(self) -> None:
        """Raise ValueError naming the flag of the first setting out of range."""
        for flag, ok, want in (("--prefix-block-chars", self.block_chars >= 1, ">= 1"),
                               ("--prefix-max-blocks", self.max_blocks >= 1, ">= 1"),
                               ("--prefix-balance", self.balance >= 0, ">= 0"),
                               ("--prefix-balance-abs", self.balance_abs >= 0, ">= 0"),
                               ("--prefix-hot-window", self.hot_window >= 0, ">= 0"),
                               ("--prefix-min-match", 0 <= self.min_match <= 1, "in [0, 1]")):
            if not ok:
                raise ValueError(f"prefix-aware: {flag} must be {want}")


class PrefixAwarePolicy(RoutingPolicy):
    """Send a request to the worker that most likely holds its prompt's prefix in KV cache.

    The prompt text (see `RouteRequest.prompt_text`) is cut into character blocks
    and hashed as a chain, which starts from the request's LoRA adapter (so the same
    prompt under two adapters shares nothing). The router remembers, for each block
    hash, the worker that owns that prefix (an LRU table of `max_table_entries`). A request
    goes to the owner of its longest remembered prefix ("prefix_hit") when that
    prefix covers at least `min_match` of the prompt's hashed blocks. Otherwise
    what is cached is worth less than an even load: the request goes to the
    least loaded worker, ties broken by consistent hashing of the prompt ("hash"
    when the ring's first choice, else "least_outstanding"). So the first turn of
    a chat whose only shared part is a short system prompt lands where there is
    room, and its later turns, mostly history, follow it.

    Load is bounded (consistent hashing with bounded loads): a worker may take a
    request only while its outstanding count stays within `(1 + balance)` times
    the fair share, or within `balance_abs` requests of the least loaded worker's,
    whichever allows more; otherwise the request walks the ring to the next worker
    with room ("overflow"). The relative bound governs at high load; the absolute
    one at low load, where a fair share is a handful of requests and one more in a
    continuous batch costs far less than the prefill a cache miss repeats. A hot
    prefix, one that brought more than a worker's fair share of the last
    `hot_window` requests, gets the relative bound alone: no worker can serve it
    alone without exceeding its share, and spreading it costs one miss on each
    worker it spreads to, paid back by all its later requests there.

    The walk starts at the matched prefix's hash, so all the overflows of one
    prefix try the same workers in the same order, whatever follows the prefix: a
    hot prefix spreads over as few replicas as the bound allows instead of melting
    one, and each of them then caches it. An overflow borrows a worker: the prefix
    keeps its owner, so the next request goes back to where it is cached instead
    of moving it (and evictions) from worker to worker.
    """

    name = PolicyName.PREFIX_AWARE
    needs_body = True

    def __init__(self, config: PrefixAwareConfig | None = None) -> None:
        config = config or PrefixAwareConfig()
        config.check()
        self.block_chars = config.block_chars
        self.max_blocks = config.max_blocks
        self.balance = config.balance
        self.balance_abs = config.balance_abs
        self.min_match = config.min_match
        self.max_table_entries = config.max_table_entries
        hot_window = config.hot_window
        self._owner: OrderedDict[int, str] = OrderedDict()
        self._ring = RingCache()
        # The prefix keys of the last `hot_window` requests, and how often each occurs.
        self._recent: deque[int] = deque(maxlen=hot_window)
        self._recent_counts: Counter[int] = Counter()
        self._seeds: dict[str, bytes] = {}  # adapter -> adapter_seed(adapter)

    def _bound(self, candidates: Sequence[Worker], hot: bool) -> int:
        """The most requests a worker may hold, this one included."""
        total = sum(w.num_outstanding for w in candidates) + 1
        relative = math.ceil((1 + self.balance) * total / len(candidates))
        if hot:
            return relative
        return max(relative, min(w.num_outstanding for w in candidates) + self.balance_abs)

    def _note(self, key: int) -> None:
        """Count `key` as the prefix of the latest request (the window drops the oldest)."""
        recent, counts = self._recent, self._recent_counts
        if not recent.maxlen:
            return  # --prefix-hot-window 0: nothing is ever hot
        if len(recent) == recent.maxlen:
            oldest = recent[0]
            counts[oldest] -= 1
            if not counts[oldest]:
                del counts[oldest]
        recent.append(key)
        counts[key] += 1

    def _is_hot(self, key: int, num_candidates: int) -> bool:
        """True when `key` brought more than one worker's fair share of the recent
        requests: no single worker can take it alone without exceeding its share."""
        recent = self._recent
        return len(recent) > 1 and self._recent_counts[key] * num_candidates > len(recent)

    def choose(self, request: RouteRequest, candidates: Sequence[Worker]) -> Decision:
        adapter = request.adapter
        seed = b""
        if adapter is not None:
            seed = self._seeds.get(adapter) or self._seeds.setdefault(
                adapter, adapter_seed(adapter))
        hashes = prefix_block_hashes(request.prompt_text, self.block_chars, self.max_blocks,
                                     seed)
        by_url = {w.url: w for w in candidates}
        owner: Worker | None = None
        ring_key = hashes[-1] if hashes else 0
        for i in range(len(hashes) - 1, -1, -1):
            url = self._owner.get(hashes[i])
            if url is not None and url in by_url:
                if (i + 1) >= self.min_match * len(hashes):
                    owner = by_url[url]
                    ring_key = hashes[i]  # overflows of one prefix go the same way round
                break  # the longest remembered prefix decides (over its bound: the ring)
        self._note(ring_key)
        bound = self._bound(candidates, hot=self._is_hot(ring_key, len(candidates)))
        decision: Decision | None = None
        if owner is not None and owner.num_outstanding + 1 <= bound:
            decision = Decision(owner, "prefix_hit")
        if decision is None:
            ring = list(self._ring.walk(ring_key, candidates))
            if owner is not None:  # a worthwhile prefix, but its owner is full: walk the ring
                reason = "overflow"
                worker = next((w for w in ring if w.num_outstanding + 1 <= bound), None)
                worker = worker or min(ring, key=lambda w: w.num_outstanding)
            else:  # nothing worth following: the least loaded, ties by the ring
                worker = min(ring, key=lambda w: w.num_outstanding)
                reason = "hash" if worker is ring[0] else "least_outstanding"
            decision = Decision(worker, reason)
        self._remember(hashes, decision.worker.url, keep=by_url if owner is not None else None)
        return decision

    def _remember(self, hashes: list[int], url: str, keep: dict[str, Worker] | None) -> None:
        """Record `url` as the owner of `hashes`. With `keep` (the request followed a
        remembered prefix, to its owner or, the owner being full, overflowing), a prefix
        already owned by a worker in `keep` stays with it and only the new blocks become
        `url`'s: an overflow must not move a hot prefix, or both workers end up caching
        it and the next overflow moves it back."""
        owner = self._owner
        for h in hashes:
            if keep is None or owner.get(h) not in keep:
                owner[h] = url
            owner.move_to_end(h)
        while len(owner) > self.max_table_entries:
            owner.popitem(last=False)
