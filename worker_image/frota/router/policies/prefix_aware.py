"""`prefix-aware`: requests that share a prompt prefix go where that prefix is cached."""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence

from frota.router.health import Worker
from frota.router.policies.base import Decision, PolicyName, RouteRequest, RoutingPolicy
from frota.router.policies.ring import RingCache


def prefix_block_hashes(text: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained hashes of the leading `block_chars`-character blocks of `text`.

    Hash i covers characters [0, (i+1) * block_chars), so two prompts share hash
    i exactly when they share that whole prefix. The router has no tokenizer,
    so blocks are characters, not tokens; a trailing partial block is hashed
    too, so short prompts still have a key.
    """
    hashes: list[int] = []
    digest = b""
    data = text.encode("utf-8", "surrogatepass")
    step = block_chars  # bytes; equal to characters for ASCII, close enough otherwise
    for start in range(0, min(len(data), step * max_blocks), step):
        digest = hashlib.blake2b(digest + data[start:start + step], digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "big"))
    return hashes


class PrefixAwarePolicy(RoutingPolicy):
    """Send a request to the worker that most likely holds its prompt's prefix in KV cache.

    The prompt text (see `RouteRequest.prompt_text`) is cut into character blocks
    and hashed as a chain. The router remembers, for each block hash, the worker
    it last sent that prefix to (an LRU table of `max_table_entries`). A request
    goes to the owner of its longest remembered prefix ("prefix_hit"); a prompt
    with no remembered prefix goes where consistent hashing of its hashed
    prefix points ("hash"), so unrelated prompts spread evenly.

    Load is bounded (consistent hashing with bounded loads): a worker may take a
    request only while its outstanding count stays within `(1 + balance)` times
    the fair share; otherwise the request walks the ring to the next worker with
    room ("overflow"). A hot prefix therefore spreads over several replicas
    instead of melting one, and each of them then caches it.
    """

    name = PolicyName.PREFIX_AWARE
    needs_body = True

    def __init__(self, block_chars: int = 128, max_blocks: int = 64, balance: float = 0.25,
                 max_table_entries: int = 200_000) -> None:
        if block_chars < 1 or max_blocks < 1 or balance < 0:
            raise ValueError("block_chars and max_blocks must be >= 1 and balance >= 0")
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.balance = balance
        self.max_table_entries = max_table_entries
        self._owner: OrderedDict[int, str] = OrderedDict()
        self._ring = RingCache()

    def _bound(self, candidates: Sequence[Worker]) -> int:
        total = sum(w.num_outstanding for w in candidates) + 1
        return math.ceil((1 + self.balance) * total / len(candidates))

    def choose(self, request: RouteRequest, candidates: Sequence[Worker]) -> Decision:
        hashes = prefix_block_hashes(request.prompt_text, self.block_chars, self.max_blocks)
        bound = self._bound(candidates)
        by_url = {w.url: w for w in candidates}
        decision: Decision | None = None
        for h in reversed(hashes):
            url = self._owner.get(h)
            if url is not None and url in by_url:
                owner = by_url[url]
                if owner.num_outstanding + 1 <= bound:
                    decision = Decision(owner, "prefix_hit")
                break  # the longest cached prefix is over its bound: fall to the ring
        if decision is None:
            key = hashes[-1] if hashes else 0
            reason = "hash"
            for worker in self._ring.walk(key, candidates):
                if worker.num_outstanding + 1 <= bound:
                    decision = Decision(worker, reason)
                    break
                reason = "overflow"
            else:  # unreachable in practice: the bound always leaves room somewhere
                decision = Decision(min(candidates, key=lambda w: w.num_outstanding), "overflow")
        self._remember(hashes, decision.worker.url)
        return decision

    def _remember(self, hashes: list[int], url: str) -> None:
        owner = self._owner
        for h in hashes:
            owner[h] = url
            owner.move_to_end(h)
        while len(owner) > self.max_table_entries:
            owner.popitem(last=False)
