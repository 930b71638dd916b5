"""`prefix-aware`: requests that share a prompt prefix go where that prefix is cached."""

from __future__ import annotations

import hashlib
import math
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Sequence
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
    return prefix_hashes(_head(text, block_chars, max_blocks), block_chars,
                         range(1, max_blocks + 1), seed)


def placement_levels(max_blocks: int) -> list[int]:
    """The prefix lengths, in blocks, a prompt may be placed by: 1 to 5, then a quarter
    longer each time (15 lengths up to 64). Fewer than every block to hash and count,
    at a cost: a chat's first turn is placed by its own conversation only when
    it runs a quarter past where it parts from other conversations; else its second
    turn moves it once."""
    levels, length = [], 1
    while length <= max_blocks:
        levels.append(length)
        length = max(length + 1, math.ceil(length * 1.25))
    return levels


def _head(text: str, block_chars: int, max_blocks: int) -> bytes:
    """The bytes of `text` that are hashed. Only those are encoded: n characters make at
    least n bytes, and an 8k-token prompt is ~32k characters, of which the default 64
    blocks of 128 hash 8k."""
    end = block_chars * max_blocks
    return text[:end].encode("utf-8", "surrogatepass")[:end]


def prefix_hashes(data: bytes, step: int, levels: Iterable[int], seed: bytes) -> list[int]:
    """The hash of `data`'s prefix of each of `levels` blocks of `step` bytes (equal to
    characters for ASCII, close enough otherwise) shorter than `data`, then of the whole.

    CRC-32 and Adler-32 run on from one prefix to the next, so each costs only its new
    bytes; together they make 64 bits, the same in every process (unlike `hash()`).
    Not cryptographic, and need not be: a collision only sends two prefixes to the
    same worker. A blake2b chain cost 2 us a block in bench/router_policy.py."""
    crc32, adler32 = zlib.crc32, zlib.adler32
    crc, adler = crc32(seed), adler32(seed)
    view = memoryview(data)
    hashes, start = [], 0
    for level in levels:
        end = level * step
        if end >= len(data):
            break
        block = view[start:end]
        crc, adler, start = crc32(block, crc), adler32(block, adler), end
        hashes.append(crc << 32 | adler)
    if start < len(data):
        block = view[start:]
        hashes.append(crc32(block, crc) << 32 | adler32(block, adler))
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

    def check(self) -> None:
        """Raise ValueError naming the flag of the first setting out of range."""
        for flag, ok, want in (("--prefix-block-chars", self.block_chars >= 1, ">= 1"),
                               ("--prefix-max-blocks", self.max_blocks >= 1, ">= 1"),
                               ("--prefix-balance", self.balance >= 0, ">= 0"),
                               ("--prefix-balance-abs", self.balance_abs >= 0, ">= 0"),
                               ("--prefix-hot-window", self.hot_window >= 0, ">= 0")):
            if not ok:
                raise ValueError(f"prefix-aware: {flag} must be {want}")


class PrefixAwarePolicy(RoutingPolicy):
    """Send a request to the worker that most likely holds its prompt's prefix in KV cache,
    by a placement every router computes alike: two routers (processes or replicas) with
    no shared state send the same prefix to the same worker.

    The prompt text (see `RouteRequest.prompt_text`) is cut into character blocks and
    hashed as a chain, which starts from the request's LoRA adapter (so the same prompt
    under two adapters shares nothing). The request is placed by one prefix key: the
    shortest of its prefixes (`placement_levels` blocks, then the whole) that is not
    hot. A prefix is hot when it began more of the last `hot_window` requests than one
    worker may take under the load bound, (1 + balance) x the fair share. So a
    tenant's requests, whose prompts share a long system prompt and differ after it,
    are placed by that prompt and meet on one worker; and when every conversation starts
    with the same system prompt (hot), each conversation is placed by its longer prefix,
    its first message included, which all its later turns share, so each conversation
    keeps one worker. A prefix's home is the first worker on the consistent-hash ring
    from its key ("prefix_hit").

    A request placed under a hot prefix (its parent, one level shorter) goes to the first
    worker on its own key's ring walk among the first k of the parent's ring, k the
    number of workers the parent's share of traffic needs ("spread"): a hot prefix
    spreads over as few workers as its load needs, each of which then caches it, and a
    worker joining that set takes keys only from the others.

    Load is bounded (consistent hashing with bounded loads): a worker may take a request
    only while its outstanding count stays within `(1 + balance)` times the fair share,
    or within `balance_abs` requests of the least loaded worker's, whichever allows more;
    otherwise the request walks on to the next worker with room ("overflow"). The
    relative bound governs at high load; the absolute one at low load, where a fair
    share is a handful of requests and one more in a continuous batch costs far less
    than the prefill a cache miss repeats. A request whose every prefix is hot (one
    prompt repeated) gets the relative bound alone. The walk's order is the same in
    every router; the loads are each router's own, so routers agree on every request
    that fits its home and may overflow differently.

    Hotness, too, is each router's own count, over the traffic it sees: routers behind
    one Service see samples of the same mix and agree on what is hot, except a prefix
    whose share sits right at the threshold.
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
        self._levels = placement_levels(config.max_blocks)
        self._ring = RingCache()
        # The prefix keys of the last `hot_window` requests, and how often each occurs.
        self._recent: deque[list[int]] = deque(maxlen=config.hot_window)
        self._recent_counts: Counter[int] = Counter()
        self._seeds: dict[str, bytes] = {}  # adapter -> adapter_seed(adapter)

    def _bound(self, candidates: Sequence[Worker], hot: bool) -> int:
        """The most requests a worker may hold, this one included."""
        total = sum(w.num_outstanding for w in candidates) + 1
        relative = math.ceil((1 + self.balance) * total / len(candidates))
        if hot:
            return relative
        return max(relative, min(w.num_outstanding for w in candidates) + self.balance_abs)

    def _note(self, keys: list[int]) -> None:
        """Count `keys` as the prefixes of the latest request (the window drops the oldest)."""
        recent, counts = self._recent, self._recent_counts
        if not recent.maxlen:
            return  # --prefix-hot-window 0: nothing is ever hot
        if len(recent) == recent.maxlen:
            for key in recent[0]:
                counts[key] -= 1
                if not counts[key]:
                    del counts[key]
        recent.append(keys)
        counts.update(keys)

    def _workers_needed(self, key: int, num_candidates: int) -> int:
        """How many workers `key`'s share of the last `hot_window` requests needs, each
        taking up to (1 + balance) x its fair share (more than one: hot). Until the
        window holds a quarter of its size, the share is of that quarter: with two
        requests seen, each conversation would be half the traffic."""
        window = self._recent.maxlen
        if not window:
            return 1
        seen = max(len(self._recent), window / 4)
        share = self._recent_counts.get(key, 0) / seen
        return max(1, min(num_candidates, math.ceil(
            share * num_candidates / (1 + self.balance) - 1e-9)))

    def choose(self, request: RouteRequest, candidates: Sequence[Worker]) -> Decision:
        adapter = request.adapter
        seed = b""
        if adapter is not None:
            seed = self._seeds.get(adapter) or self._seeds.setdefault(
                adapter, adapter_seed(adapter))
        data = _head(request.prompt_text, self.block_chars, self.max_blocks)
        keys = prefix_hashes(data, self.block_chars, self._levels, seed) or [0]
        self._note(keys)
        n = len(candidates)
        # The shortest prefix that is not hot. Counts only fall along a prompt (every
        # request that counts a prefix counts the shorter ones), so a later turn of a
        # chat, whose text extends an earlier turn's, stops at the same prefix.
        level, needed, parent_needed = 0, self._workers_needed(keys[0], n), 1
        while needed > 1 and level + 1 < len(keys):
            level += 1
            parent_needed, needed = needed, self._workers_needed(keys[level], n)
        hot = needed > 1  # even the whole prompt is hot: one prompt repeated
        walk: Iterable[Worker] = self._ring.walk(keys[level], candidates)
        reason = "prefix_hit"
        if parent_needed > 1 and not hot:  # under a hot parent: among the workers it needs
            parent = list(self._ring.walk(keys[level - 1], candidates))
            subset = parent[:parent_needed]
            first = next(w for w in walk if w in subset)
            walk = [first, *(w for w in parent if w is not first)]
            reason = "spread"
        bound = self._bound(candidates, hot)
        walk = iter(walk)
        first = next(walk)
        if first.num_outstanding + 1 <= bound:
            return Decision(first, reason)
        rest = list(walk)
        worker = next((w for w in rest if w.num_outstanding + 1 <= bound), None)
        return Decision(worker or min([first, *rest], key=lambda w: w.num_outstanding),
                        "overflow")
