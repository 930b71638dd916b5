"""LoRA adapters over the engine's model (S-LoRA / punica style): many adapters served in
one batch, their weights in a fixed pool of slots, moved in and out by an LRU.

- `adapter`: read and validate a PEFT directory into host tensors (scaling folded into B);
- `slots`: the pool of `max_loras` slots per adapted projection, pins and the LRU of idle slots;
- `batch`: which rows of a step use which slot ("no adapter" rows are simply absent);
- `ops`: the delta, by gather for decode rows (BGMV) and by segments for prefill chunks (SGMV);
- `layers`: the wrapper around each adapted projection;
- `manager`: names -> loaded adapters -> slots; what the engine calls.

This package's top level stays torch-free: `AdapterError` and `AdapterInfo` are what the
server needs.
"""

from frota.engine.lora.errors import AdapterError, AdapterInfo

__all__ = ["AdapterError", "AdapterInfo"]
