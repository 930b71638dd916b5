"""A small test double of `frota.engine.AsyncEngine` (the contract in docs/internals.md),
fitting `frota.server.engine_api.OnlineEngine` and made of the engine's own torch-free types.

Byte-level tokenizer (vocab 256 + EOS 256); "generation" walks the lowercase
alphabet from the last prompt byte (greedy) or draws letters from a seeded RNG,
one token per `step_s`, so tests control timing, stop strings and seeds.

LoRA: `load_adapter(name, path)` reads `path/adapter_config.json` (`r`, `target_modules`)
and refuses what the real engine refuses in kind (missing or corrupt file, a rank above
`max_lora_rank`, an unknown target, a name taken) with the engine's `AdapterError`. Under an
adapter of rank r the greedy walk steps r + 1 letters at a time, so its output differs from
the base model's deterministically.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from frota.engine import (
    EngineStats,
    InvalidRequestError,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from frota.engine.lora import AdapterError, AdapterInfo

EOS = 256
LETTERS = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz "]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(directory: Path, rank: int = 8,
                  targets: Sequence[str] = ("q_proj", "v_proj")) -> str:
    """A directory the fake engine loads as an adapter of `rank`; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": list(targets)}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return str(directory)


class FakeTokenizer:
    def __init__(self) -> None:
        self.eos_token_ids = [EOS]
        self.vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        for m in messages:
            if m["role"] not in {"system", "user", "assistant"}:
                raise ValueError(f"unknown role {m['role']}")
        body = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return body + "<assistant>"


class FakeEngine:
    """Implements the AsyncEngine surface the server uses."""

    def __init__(self, max_model_len: int = 512, max_num_seqs: int = 4, step_s: float = 0.0,
                 eos_after: int | None = None, max_loras: int = 0,
                 max_lora_rank: int = 16) -> None:
        self.tokenizer = FakeTokenizer()
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.step_s = step_s
        self.eos_after = eos_after  # greedy requests emit EOS after this many tokens
        self.block_size = 16
        self.num_kv_blocks_total = 64
        self.running: dict[str, int] = {}  # request id -> blocks held
        self.waiting: list[str] = []
        self.aborted: set[str] = set()
        self.requests: list[tuple[str, list[int], SamplingParams]] = []
        self.gate = asyncio.Event()  # cleared: every request waits (queue tests)
        self.gate.set()
        self.is_shut_down = False
        self.is_running = True  # False: the step loop died (the worker turns unhealthy)
        self.reject_next = False  # the next generate raises InvalidRequestError
        self.max_loras = max_loras  # 0: LoRA off, as EngineArgs.max_loras
        self.max_lora_rank = max_lora_rank
        self.loaded: dict[str, AdapterInfo] = {}
        self.request_adapters: dict[str, str] = {}  # request id -> adapter (running or waiting)

    def stats(self) -> EngineStats:
        used = sum(self.running.values())
        def names(ids: list[str]) -> tuple[str, ...]:
            return tuple(sorted({self.request_adapters[i] for i in ids
                                 if i in self.request_adapters}))

        return EngineStats(len(self.running), len(self.waiting), self.num_kv_blocks_total, used,
                           self.block_size, 0, 0, running_adapters=names(list(self.running)),
                           waiting_adapters=names(list(self.waiting)),
                           max_adapters=self.max_loras)

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        if self.max_loras == 0:
            raise AdapterError("LoRA is not enabled: start the engine with max_loras > 0",
                               "lora_disabled")
        if name in self.loaded:
            raise AdapterError(f"an adapter named {name!r} is already loaded", "adapter_exists")
        config_path = Path(path) / "adapter_config.json"
        if not config_path.is_file():
            raise AdapterError(f"adapter_config.json is missing from {path!r}")
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError as exc:
            raise AdapterError(f"adapter_config.json in {path!r} is not valid JSON: {exc}") from exc
        rank, targets = int(config["r"]), tuple(config["target_modules"])
        unsupported = [t for t in targets if t not in TARGETS]
        if unsupported:
            raise AdapterError(f"unsupported target module(s) {', '.join(unsupported)}")
        if rank > self.max_lora_rank:
            raise AdapterError(f"rank {rank} is above max_lora_rank {self.max_lora_rank}")
        await asyncio.sleep(0)
        info = self.loaded[name] = AdapterInfo(name, path, rank, targets, resident=False)
        return info

    async def unload_adapter(self, name: str) -> None:
        if self.loaded.pop(name, None) is None:
            raise AdapterError(f"no adapter named {name!r} is loaded", "adapter_not_found")

    async def adapters(self) -> list[AdapterInfo]:
        return list(self.loaded.values())

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)
        self.running.pop(request_id, None)
        if request_id in self.waiting:
            self.waiting.remove(request_id)

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        self.is_shut_down = True

    async def generate(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                       *, adapter: str | None = None,
                       seq: object = None) -> AsyncIterator[RequestOutput]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if seq is not None:  # a sequence from a kv_transfer stand-in (tests/server/test_kv_adapters)
            adapter = getattr(seq, "adapter", None)
        if adapter is not None and adapter not in self.loaded:
            raise AdapterError(f"no adapter named {adapter!r} is loaded", "adapter_not_found")
        # The weights a request starts with are its own till it finishes, as in the engine.
        step = 1 + (self.loaded[adapter].rank if adapter is not None else 0)
        if self.reject_next:
            self.reject_next = False
            raise InvalidRequestError("rejected by the engine", "prompt")
        if any(not 0 <= t < self.tokenizer.vocab_size for t in ids):
            raise InvalidRequestError("prompt token ids out of range", "prompt")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError("prompt too long", "prompt")
        if params.max_tokens < (0 if params.prompt_logprobs is not None else 1):
            raise InvalidRequestError("max_tokens must be at least 1", "max_tokens")
        if any(not 0 <= t < self.tokenizer.vocab_size for t in params.logit_bias or ()):
            raise InvalidRequestError("logit_bias token ids out of range", "logit_bias")
        self.requests.append((request_id, ids, params))
        if adapter is not None:
            self.request_adapters[request_id] = adapter
        self.waiting.append(request_id)
        try:
            while not self.gate.is_set() or len(self.running) >= self.max_num_seqs:
                if request_id in self.aborted:
                    return
                await asyncio.sleep(0.005)
            self.waiting.remove(request_id)
            self.running[request_id] = math.ceil(len(ids) / self.block_size)
            async for out in self._decode(request_id, ids, params, step):
                yield out
        finally:
            self.request_adapters.pop(request_id, None)
            self.running.pop(request_id, None)
            if request_id in self.waiting:
                self.waiting.remove(request_id)

    async def _decode(self, request_id: str, ids: list[int], params: SamplingParams,
                      step: int = 1) -> AsyncIterator[RequestOutput]:
        rng = random.Random(params.seed)
        last = ids[-1]
        text = ""
        generated: list[int] = []
        # Prompt token i scores -i/10; the first has no score.
        scored = None if params.prompt_logprobs is None else [None] + [
            TokenLogprob(t, -i / 10, {t: -i / 10} if params.prompt_logprobs else {})
            for i, t in enumerate(ids[1:], start=1)]
        if params.max_tokens == 0:
            yield RequestOutput(request_id, [], "", None, True, "length", len(ids), 0, 0,
                                prompt_logprobs=scored)
            return
        while True:
            if self.step_s:
                await asyncio.sleep(self.step_s)
            else:
                await asyncio.sleep(0)
            if request_id in self.aborted:
                yield RequestOutput(request_id, [], "", None, True, "abort", len(ids), len(generated), 0)
                return
            if params.temperature == 0:
                token = LETTERS[(LETTERS.index(last) + step) % len(LETTERS)] if last in LETTERS \
                    else LETTERS[0]
            else:
                token = rng.choice(LETTERS)
            if (self.eos_after is not None and len(generated) >= self.eos_after
                    and not params.ignore_eos):
                token = EOS
            generated.append(token)
            last = token
            piece = self.tokenizer.decode([token])
            reason = None
            if token == EOS or token in params.stop_token_ids:
                reason, piece = "stop", ""
            text += piece
            for stop in params.stop:
                if stop in text:
                    cut = text.index(stop)
                    piece = piece[: max(0, len(piece) - (len(text) - cut))]
                    reason = "stop"
            if reason is None and len(generated) >= params.max_tokens:
                reason = "length"
            logprobs = None
            if params.logprobs is not None:
                top = {t: -0.5 - i for i, t in enumerate(LETTERS[: max(params.logprobs, 1)])}
                logprobs = [TokenLogprob(token, -0.1, top)]
            blocks = math.ceil((len(ids) + len(generated)) / self.block_size)
            self.running[request_id] = blocks
            yield RequestOutput(request_id, [token], piece, logprobs, reason is not None, reason,
                                len(ids), len(generated), 0,
                                prompt_logprobs=scored if len(generated) == 1 else None)
            if reason is not None:
                return


class StubKV:
    """The `KVTransfer` surface the routes call, recording the sequences they build."""

    def __init__(self) -> None:
        self.sequences: list[SimpleNamespace] = []

    def fingerprint(self) -> str:
        return "fp"

    def layout(self) -> dict[str, Any]:
        return {}

    @staticmethod
    def prompt_digest(ids: list[int]) -> str:
        return f"digest-{len(ids)}"

    def new_sequence(self, request_id: str, prompt: list[int], params: Any, *,
                     keep_kv: bool = False, adapter: str | None = None) -> SimpleNamespace:
        seq = SimpleNamespace(request_id=request_id, token_ids=list(prompt), adapter=adapter,
                              num_prompt_tokens=len(prompt), keep_kv=keep_kv)
        self.sequences.append(seq)
        return seq

    async def release(self, seq: Any) -> None:
        pass

    def holds_blocks(self, seq: Any) -> bool:
        return False


async def prefill_handle(client: Any, authorization: tuple[str, str], model: str,
                         prompt: str = "ab") -> dict[str, Any]:
    """A worker's KV handle for `prompt` (its prefill route, called as the router calls it)."""
    resp = await client.post("/internal/kv/prefill/v1/completions", headers=dict([authorization]),
                             json={"model": model, "prompt": prompt, "max_tokens": 4})
    assert resp.status == 200, await resp.text()
    return (await resp.json())["kv_handle"]
