"""KV export/import between two engines in one process: prefill -> bytes -> decode equals the
colocated engine token for token (synthetic model: exactness is the point, speed matters)."""

from __future__ import annotations

import asyncio

import pytest

from frota.engine import AsyncEngine, EngineArgs, SamplingParams

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
    """Through `AsyncEngine.kv_transfer`, the interface the worker's KV routes use."""
    first_params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=params.ignore_eos)
    src, dst = prefill.kv_transfer, decode.kv_transfer
    seq = src.new_sequence("p", prompt, first_params, keep_kv=True)
    first, _ = await _collect(prefill, "p", prompt, first_params, seq=seq)
    assert src.holds_blocks(seq), "a prefill-only sequence keeps its blocks at finish"
    header, parts = src.export(seq)
    n_blocks = -(-len(prompt) // prefill.engine.block_manager.block_size)
    assert header["num_blocks"] == n_blocks and header["num_prompt_tokens"] == len(prompt)
    assert len(header["parts"]) == src.num_parts()
    data = [bytes(p) for p in parts]
    used_before = prefill.stats().num_kv_blocks_used
    await src.release(seq)
    assert prefill.stats().num_kv_blocks_used == used_before - n_blocks

    assert header["fingerprint"] == src.fingerprint() == dst.fingerprint()
    dseq = dst.new_sequence("d", prompt, params)
    assert await dst.reserve(dseq)
    for i, (spec, chunk) in enumerate(zip(header["parts"], data, strict=True)):
        dst.import_part(dseq, i, chunk, spec)
    dst.finish_import(dseq, first[0])
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
