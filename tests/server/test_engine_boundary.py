"""The one boundary between the server and the engine: `frota.server.engine_api.OnlineEngine`.

Both engines the server is given, the real `frota.engine.AsyncEngine` and the test double,
have every member the protocol names, with its parameters and its sync/async kind, and
answer with the engine's own types (one `RequestOutput`, one `EngineStats`). The server
imports the engine's plain data only, never torch.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import typing
from collections.abc import AsyncIterator

import pytest

from frota.engine import EngineStats, RequestOutput, SamplingParams
from frota.engine.lora import AdapterError
from frota.server.engine_api import OnlineEngine, Tokenizer
from tests.server.fake_engine import FakeEngine

PROTOCOLS = {OnlineEngine: None, Tokenizer: "tokenizer"}  # protocol -> where it sits on an engine


def _members(protocol: type) -> dict[str, object]:
    """Name -> the protocol's declaration (a function, a property, or an annotation)."""
    declared: dict[str, object] = dict(typing.get_type_hints(protocol))
    for name, value in vars(protocol).items():
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
            declared[name] = value
    return declared


def _kind(fn: object) -> str:
    if inspect.isasyncgenfunction(fn):
        return "async generator"
    if inspect.iscoroutinefunction(fn):
        return "coroutine"
    return "function"


def mismatches(impl: object, protocol: type) -> list[str]:
    """What `impl` lacks or declares differently from `protocol`."""
    problems = []
    hints = typing.get_type_hints
    for name, declared in _members(protocol).items():
        if not hasattr(impl, name):
            problems.append(f"{name}: missing")
            continue
        if not inspect.isfunction(declared):
            continue
        method = getattr(impl, name)
        want = _kind(declared)
        if want == "function" and typing.get_origin(hints(declared).get("return")) is AsyncIterator:
            want = "async generator"
        if _kind(method) != want:
            problems.append(f"{name}: a {_kind(method)}, the protocol's is a {want}")
        wanted = list(inspect.signature(declared).parameters.values())[1:]  # past self
        has = list(inspect.signature(method).parameters.values())
        for i, param in enumerate(wanted):
            if i >= len(has) or (has[i].name, has[i].kind) != (param.name, param.kind):
                problems.append(f"{name}: parameter {i} should be {param.name} ({param.kind.name})")
        problems += [f"{name}: extra parameter {p.name} has no default"
                     for p in has[len(wanted):] if p.default is inspect.Parameter.empty
                     and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return problems


async def _one_request(engine: OnlineEngine) -> tuple[list[RequestOutput], EngineStats]:
    await engine.start()
    try:
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        prompt = engine.tokenizer.encode("Hello")
        outs = [out async for out in engine.generate("boundary", prompt, params)]
        return outs, engine.stats()
    finally:
        await engine.shutdown()


def _real_engine(max_loras: int = 0) -> OnlineEngine:
    pytest.importorskip("torch")
    from frota.engine import AsyncEngine, EngineArgs

    return AsyncEngine(EngineArgs(model="synthetic:dense-tiny", dtype="float32", num_kv_blocks=32,
                                  block_size=4, verbose=False, max_loras=max_loras))


@pytest.mark.parametrize("make", [FakeEngine, _real_engine], ids=["fake", "real"])
def test_both_engines_fit_the_servers_protocol_and_answer_with_the_engines_types(make) -> None:
    engine = make()
    for protocol, attribute in PROTOCOLS.items():
        impl = engine if attribute is None else getattr(engine, attribute)
        assert mismatches(impl, protocol) == [], protocol.__name__
    outs, stats = asyncio.run(_one_request(engine))
    assert all(type(out) is RequestOutput for out in outs)
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert sum(len(out.new_token_ids) for out in outs) == 3
    assert type(stats) is EngineStats and stats.num_running == 0


def test_the_check_names_what_does_not_fit() -> None:
    class Drifted:
        tokenizer = None
        is_running = True

        def generate(self, request_id: str, params: SamplingParams) -> list[RequestOutput]:
            return []

        async def abort(self, request_id: str) -> None: ...

    assert mismatches(Drifted(), OnlineEngine) == [
        "max_model_len: missing",
        "generate: a function, the protocol's is a async generator",
        "generate: parameter 1 should be prompt (POSITIONAL_OR_KEYWORD)",
        "generate: parameter 2 should be params (POSITIONAL_OR_KEYWORD)",
        "generate: parameter 3 should be adapter (KEYWORD_ONLY)",
        "abort: a coroutine, the protocol's is a function",
        "stats: missing",
        "load_adapter: missing",
        "unload_adapter: missing",
        "adapters: missing",
        "start: missing",
        "shutdown: missing",
    ]


def test_the_server_imports_no_torch() -> None:
    code = ("import sys, frota.server.app, frota.server.kv_routes, frota.server.cli; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


async def _refusals(engine: OnlineEngine) -> tuple[list[object], list[str]]:
    """What an engine with LoRA on says to adapters it does not have."""
    await engine.start()
    codes = []
    try:
        listed = list(await engine.adapters())
        params = SamplingParams(max_tokens=1, temperature=0.0)
        with pytest.raises(AdapterError) as refused:
            async for _ in engine.generate("x", engine.tokenizer.encode("Hi"), params,
                                           adapter="nope"):
                pass
        codes.append(refused.value.code)
        with pytest.raises(AdapterError) as refused:
            await engine.unload_adapter("nope")
        codes.append(refused.value.code)
        with pytest.raises(AdapterError) as refused:
            await engine.load_adapter("bad", "/nonexistent/adapter")
        codes.append(refused.value.code)
        return listed, codes
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("make", [lambda: FakeEngine(max_loras=2), lambda: _real_engine(2)],
                         ids=["fake", "real"])
def test_both_engines_refuse_unknown_adapters_with_the_engines_adapter_error(make) -> None:
    listed, codes = asyncio.run(_refusals(make()))
    assert listed == []
    assert codes == ["adapter_not_found", "adapter_not_found", "invalid_adapter"]
