"""Names -> loaded adapters -> slots: what the engine, its scheduler and its runner call.

- `load`/`read`+`register`: an adapter is read and validated into host memory; it becomes
  resident only when a sequence under it is admitted (`acquire`).
- `unload`: the name is gone at once (new requests for it fail), but a sequence already
  accepted holds its `LoadedAdapter` and runs under those weights to its last token; the
  slot is freed when the last of them releases it. A new load under the same name is a new
  object, with a new `load_id` (a new prefix-cache root) and its own slot.
- Admission pins a slot for the sequence (`acquire`); finishing and preemption release it
  (a preempted sequence recomputes anyway, and its adapter's host copy is unchanged, so it
  re-acquires the same weights, maybe in another slot).

Tensor parallelism: rank 0 decides; every slot it writes is listed (`take_writes`) and sent
with the step, and each follower reads the same adapter from the same path and writes its
own shard into the same slot (`apply_writes`).
"""

from __future__ import annotations

import threading

import torch

from frota.api.memory import ModelShape
from frota.engine.config import EngineArgs
from frota.engine.lora.adapter import LoadedAdapter, read_adapter
from frota.engine.lora.errors import AdapterError, AdapterInfo
from frota.engine.lora.layers import install
from frota.engine.lora.slots import ShardRanges, SlotPool, SlotsBusy, build_pool
from frota.engine.progress import progress


class LoRAManager:
    """The adapters of one engine and its pool of `max_loras` slots of rank `max_rank`."""

    def __init__(self, model: torch.nn.Module, shape: ModelShape, max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device, *, layers: range | None = None,
                 shard: ShardRanges | None = None) -> None:
        """`shape`: the full (unsharded) model's; `layers`: the global indices of `model`'s
        layers (a pipeline stage's); `shard`: this rank's slices (the whole widths by default)."""
        self.shape = shape
        self.max_loras = max_loras
        self.max_rank = max_rank
        q = shape.num_heads * shape.head_dim
        kv = shape.num_kv_heads * shape.head_dim
        shard = shard or ShardRanges((0, q), (0, kv), (0, shape.intermediate_size))
        layers = layers if layers is not None else range(shape.num_layers)
        install(model)
        self.pool: SlotPool = build_pool(model, max_loras, max_rank, layers, shard, dtype, device)
        self.by_name: dict[str, LoadedAdapter] = {}
        self._lock = threading.Lock()  # loads are read off the engine thread (AsyncEngine)
        self._writes: list[tuple[int, str, str, int]] = []  # (slot, name, path, load_id)
        self._remote: dict[int, LoadedAdapter] = {}  # followers: load_id -> what rank 0 sent

    # -- names ----------------------------------------------------------------------------

    def read(self, name: str, path: str) -> LoadedAdapter:
        """Read and validate an adapter without registering it (safe on any thread)."""
        self._check_free(name)
        return read_adapter(name, path, self.shape, self.max_rank)

    def register(self, adapter: LoadedAdapter) -> AdapterInfo:
        with self._lock:
            self._check_free(adapter.name)
            self.by_name[adapter.name] = adapter
        return adapter.info()

    def load(self, name: str, path: str) -> AdapterInfo:
        return self.register(self.read(name, path))

    def unload(self, name: str) -> None:
        with self._lock:
            adapter = self.by_name.pop(name, None)
        if adapter is None:
            raise AdapterError(f"no adapter named {name!r} is loaded", "adapter_not_found")
        adapter.is_unloaded = True
        self.pool.forget(adapter)  # only if idle; pinned slots are freed by their last release

    def get(self, name: str) -> LoadedAdapter:
        adapter = self.by_name.get(name)
        if adapter is None:
            raise AdapterError(f"no adapter named {name!r} is loaded: load it first "
                               f"(loaded: {', '.join(sorted(self.by_name)) or 'none'})",
                               "adapter_not_found")
        return adapter

    def infos(self) -> list[AdapterInfo]:
        return [a.info() for a in list(self.by_name.values())]

    def _check_free(self, name: str) -> None:
        if name in self.by_name:
            raise AdapterError(f"an adapter named {name!r} is already loaded: unload it first "
                               f"or pick another name", "adapter_exists")

    # -- slots ----------------------------------------------------------------------------

    def acquire(self, adapter: LoadedAdapter) -> bool:
        """Pin `adapter` in a slot; False when every slot is pinned by others (wait)."""
        try:
            slot = self.pool.acquire(adapter)
        except SlotsBusy:
            return False
        if slot is not None:
            self._writes.append((slot, adapter.name, adapter.path, adapter.load_id))
        return True

    def release(self, adapter: LoadedAdapter) -> None:
        self.pool.release(adapter)

    def take_writes(self) -> list[tuple[int, str, str, int]]:
        """The slots written since the last call (what followers must write too)."""
        writes, self._writes = self._writes, []
        return writes

    def apply_writes(self, writes: list[tuple[int, str, str, int]]) -> None:
        """A follower: write this rank's shard of each adapter rank 0 put in a slot."""
        for slot, name, path, load_id in writes:
            adapter = self._remote.get(load_id)
            if adapter is None:
                adapter = read_adapter(name, path, self.shape, self.max_rank)
                self._remote[load_id] = adapter
            self.pool.write(slot, adapter)


def adapter_slots(args: EngineArgs, model: torch.nn.Module, shape: ModelShape, dtype: torch.dtype,
                  device: torch.device, shard: tuple[range, ShardRanges] | None = None,
                  ) -> LoRAManager | None:
    """The engine's adapter slots (`args.max_loras` of rank `args.max_lora_rank`) over
    `model`, or None when LoRA is off. `shard`: a sharded rank's layers and slices."""
    if args.max_loras == 0:
        return None
    layers, ranges = shard if shard is not None else (None, None)
    manager = LoRAManager(model, shape, args.max_loras, args.max_lora_rank, dtype, device,
                          layers=layers, shard=ranges)
    progress(args.verbose, f"LoRA: {args.max_loras} adapter slots of rank "
                           f"{args.max_lora_rank}, {manager.pool.nbytes() / 2**20:.1f} MiB")
    return manager
