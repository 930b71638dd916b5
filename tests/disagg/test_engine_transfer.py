"""KV export/import between two engines in one process: prefill -> bytes -> decode equals the
colocated engine token for token (synthetic model: exactness is the point, speed matters)."""

from __future__ import annotations

import asyncio

import pytest

from frota.engine import AsyncEngine, EngineArgs, SamplingParams
from frota.engine.kv_transfer import (
    export_parts,
    import_part,
    layout_fingerprint,
    part_specs,
    release,
    reserve,
)

MODEL = "synthetic:dense-tiny"


def _args(**kw: object) -> EngineArgs:
    base = dict(model=MODEL, dtype="float32", num_kv_blocks=64, block_size=8, verbose=False,
                max_num_batched_tokens=32)
    base.update(kw)
    return EngineArgs(**base)  # type: ignore[arg-type]


async def _collect(engine: AsyncEngine, rid: str, prompt: list[int], params: SamplingParams,
                   **kw: object) -> tuple[list[int], str]:
    ids: list[int] = []
    text = ""
    async for out in engine.generate(rid, prompt, params, **kw):  # type: ignore[arg-type]
        ids.extend(out.new_token_ids)
        text += out.new_text
    return ids, text


async def _disaggregated(prefill: AsyncEngine, decode: AsyncEngine, prompt: list[int],
                         params: SamplingParams) -> tuple[list[int], str]:
    first_params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=params.ignore_eos)
    seq = prefill.engine.make_sequence("p", prompt, first_params)
    seq.keep_kv = True
    first, _ = await _collect(prefill, "p", prompt, first_params, seq=seq)
    assert seq.block_table, "a prefill-only sequence keeps its blocks at finish"
    n_blocks = -(-len(prompt) // prefill.engine.block_manager.block_size)
    specs = part_specs(prefill.engine, n_blocks)
    data = [bytes(p) for p in export_parts(prefill.engine, seq.block_table[:n_blocks])]
    used_before = prefill.stats().num_kv_blocks_used
    await prefill.call(lambda e: release(e, seq))
    assert prefill.stats().num_kv_blocks_used == used_before - n_blocks

    assert layout_fingerprint(prefill.engine) == layout_fingerprint(decode.engine)
    dseq = decode.engine.make_sequence("d", prompt, params)
    assert await decode.call(lambda e: reserve(e, dseq, len(prompt)))
    for i, (spec, chunk) in enumerate(zip(specs, data, strict=True)):
        import_part(decode.engine, i, dseq.block_table, chunk, spec)
    dseq.num_computed_tokens = len(prompt)
    dseq.append_token(first[0])
    return await _collect(decode, "d", prompt, params, seq=dseq)


# int8 KV: the engine's decode attention does not run on QuantizedKVCache yet (index_select).
@pytest.mark.parametrize("kv_cache_dtype", ["auto"])
def test_prefill_transfer_decode_equals_colocated_greedy(kv_cache_dtype: str) -> None:
    async def main() -> None:
        a = AsyncEngine(_args(kv_cache_dtype=kv_cache_dtype))
        b = AsyncEngine(_args(kv_cache_dtype=kv_cache_dtype), loaded=a.engine.loaded)
        await a.start()
        await b.start()
        try:
            params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
            for length in (5, 8, 37):  # partial block, exact block, several blocks
                prompt = [(7 * i + length) % 250 for i in range(length)]
                colocated = await _collect(a, f"c{length}", prompt, params)
                assert await _disaggregated(a, b, prompt, params) == colocated
            assert b.stats().num_kv_blocks_used == 0  # imported blocks freed at finish
            assert a.stats().num_kv_blocks_used == 0
        finally:
            await a.shutdown()
            await b.shutdown()

    asyncio.run(main())


def test_max_tokens_one_finishes_on_the_imported_token() -> None:
    async def main() -> None:
        a = AsyncEngine(_args())
        b = AsyncEngine(_args(), loaded=a.engine.loaded)
        await a.start()
        await b.start()
        try:
            params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
            prompt = list(range(20))
            colocated = await _collect(a, "c", prompt, params)
            assert await _disaggregated(a, b, prompt, params) == colocated
            assert b.stats().num_kv_blocks_used == 0
        finally:
            await a.shutdown()
            await b.shutdown()

    asyncio.run(main())
