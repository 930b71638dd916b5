"""The KV block pool's bookkeeping: allocation, reference counts and the prefix cache.

Blocks hold `block_size` token slots. A full block that has been computed gets a
chained hash (its parent's hash + its own tokens), so a later prompt with the same
prefix can share it. Freed blocks keep their hash and sit in an LRU list; they are
only forgotten when the pool needs them for something else.
"""

from __future__ import annotations

from collections import OrderedDict

from frota.engine.sequence import Sequence


class Block:
    """One slot range of the KV pool."""

    __slots__ = ("block_hash", "block_id", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


def chain_hash(parent_hash: int | tuple | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def chain_root(seq: Sequence) -> tuple[str, int] | None:
    """The parent of a sequence's first block: None for the base model, the adapter's unique
    load id under LoRA, so KV computed under one adapter never serves another (nor the base,
    nor a later load under the same name)."""
    return None if seq.adapter is None else ("lora", seq.adapter.load_id)


class BlockManager:
    """Owns the block pool; pairs each check with its action (can_append/append_slots)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion order is eviction order: the front is the least recently freed.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of those, tokens found in the cache

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    def _take_free_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self.hash_to_block.get(block.block_hash) == block_id:
                del self.hash_to_block[block.block_hash]
            block.block_hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id

    def allocate_cached_prefix(self, seq: Sequence) -> int:
        """Give a fresh sequence the cached blocks of its longest cached prefix; return its tokens.

        At least one token is always left to compute, so the step produces logits.
        """
        # Prompt logprobs need every prompt position computed, so those requests never hit.
        if not self.enable_prefix_caching or seq.block_table or seq.params.prompt_logprobs is not None:
            return 0
        bs = self.block_size
        parent: int | tuple | None = chain_root(seq)
        hashes: list[int] = []
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            hashes.append(h)
            parent = h
        seq.block_hashes = hashes
        seq.num_hashed_blocks = len(hashes)
        seq.num_computed_tokens = len(hashes) * bs
        return seq.num_computed_tokens

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow the block table so `num_new_tokens` more tokens have slots."""
        for _ in range(self.num_blocks_needed(seq, num_new_tokens)):
            seq.block_table.append(self._take_free_block())

    def register_computed_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Hash the blocks that are full of computed tokens (or of the first `num_tokens`, which
        this step computes), so others can share them.

        Registering at schedule time is safe: in every layer, the step writes all of its new K/V
        into the pool before any attention reads it, so a sequence admitted in the same step can
        read blocks that another sequence in the step is filling.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = (seq.num_computed_tokens if num_tokens is None else num_tokens) // bs
        hashes = seq.block_hashes
        while seq.num_hashed_blocks < num_full:
            i = seq.num_hashed_blocks
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(hashes[i - 1] if i else chain_root(seq), tokens)
            hashes.append(h)
            if h not in self.hash_to_block:
                block = self.blocks[seq.block_table[i]]
                block.block_hash = h
                block.token_ids = tokens
                self.hash_to_block[h] = block.block_id
            seq.num_hashed_blocks += 1

    def deallocate(self, seq: Sequence) -> None:
        """Return a sequence's blocks; its tail goes first in eviction order."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table = []
        seq.block_hashes = []
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0
