"""Loads, unloads, reloads and evictions while requests are in flight never change the
adapter a request runs under, from its first token to its last (vLLM issue #47724: a
request served with another user's adapter after a runtime load)."""

from __future__ import annotations

import asyncio

import pytest

from frota.engine import AdapterError
from frota.engine.async_engine import AsyncEngine
from tests.engine.lora import synthetic
from tests.engine.lora.engines import greedy, run

N = 32  # long enough that the churn below lands mid-generation


def test_churn_while_requests_run_never_changes_their_adapter(loaded, adapters):
    ids = synthetic.prompts(6)
    reference = synthetic.make_engine(loaded, max_loras=3)
    for name, path in adapters.items():
        reference.load_adapter(name, str(path))
    plan = [("a0", 0), ("a1", 1), (None, 2), ("a0", 3), ("a1", 4), (None, 5)]
    want = [run(reference, [(name, ids[i])], N)[0] for name, i in plan]
    # after the churn, "a0" names a2's weights: a new request must get those
    want_after = run(reference, [("a2", ids[0])], N)[0]

    async def main() -> tuple[list[list[int]], list[int]]:
        engine = AsyncEngine(synthetic.make_engine(loaded, max_loras=2).args,
                             loaded=loaded)
        await engine.start()
        try:
            for name in ("a0", "a1"):
                await engine.load_adapter(name, str(adapters[name]))

            async def one(k: int, name: str | None, i: int) -> list[int]:
                tokens: list[int] = []
                async for out in engine.generate(f"r{k}", ids[i], greedy(N), adapter=name):
                    tokens.extend(out.new_token_ids)
                    await asyncio.sleep(0)
                return tokens

            tasks = [asyncio.create_task(one(k, name, i)) for k, (name, i) in enumerate(plan)]
            while not any(s.num_generated_tokens for s in list(engine.engine.scheduler.running)):
                await asyncio.sleep(0.001)
            in_flight = engine.stats().running_adapters
            # mid-flight: unload a0 and load other weights under its name, then bring in a2
            # too (2 slots: it must wait for, or evict, an idle one, never a pinned one)
            await engine.unload_adapter("a0")
            with pytest.raises(AdapterError, match="no adapter named 'a0'"):
                engine.engine.make_sequence("late", ids[0], greedy(1), adapter="a0")
            await engine.load_adapter("a0", str(adapters["a2"]))
            await engine.load_adapter("a2", str(adapters["a2"]))
            extra = asyncio.create_task(one(99, "a2", 1))
            await engine.unload_adapter("a1")
            got = await asyncio.gather(*tasks)
            await extra
            after = await one(100, "a0", 0)
            listed = {i.name for i in await engine.adapters()}
            assert listed == {"a0", "a2"}
            assert "a0" in in_flight and "a1" in in_flight, in_flight  # the churn was mid-flight
            return got, after
        finally:
            await engine.shutdown()

    got, after = asyncio.run(main())
    assert got == want
    assert after == want_after
