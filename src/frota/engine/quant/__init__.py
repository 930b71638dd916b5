"""Quantized weights and KV cache for the engine.

Modules, one concept each:

- `formats`: int8 / int4 / fp8 weight formats (quantize, dequantize, int4 packing);
- `linear`: `QuantLinear` layers whose forward picks a fused torch kernel or a fallback;
- `gguf_native`: GGUF Q4_0 / Q4_1 / Q8_0 blocks onto those formats, bit for bit;
- `kv`: int8 / fp8 KV cache storage with per-token, per-head scales;
- `apply`: turning a loaded float model into a quantized one (`QuantConfig`).

Bytes of weights and of KV per token are the contract's, `frota.api.memory` (torch-free,
shared with the planner). This package imports nothing at import time, so
`frota.engine.quant.config` stays torch-free.
"""
