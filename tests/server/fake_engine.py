"""A small test double of `frota.engine.AsyncEngine` (the contract in docs/internals.md),
fitting `frota.server.engine_api.Engine` and made of the engine's own torch-free types.

Byte-level tokenizer (vocab 256 + EOS 256); "generation" walks the lowercase
alphabet from the last prompt byte (greedy) or draws letters from a seeded RNG,
one token per `step_s`, so tests control timing, stop strings and seeds.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Sequence

from frota.engine import (
    EngineStats,
    InvalidRequestError,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)

EOS = 256
LETTERS = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz "]


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
                 eos_after: int | None = None) -> None:
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

    def stats(self) -> EngineStats:
        used = sum(self.running.values())
        return EngineStats(len(self.running), len(self.waiting), self.num_kv_blocks_total, used,
                           self.block_size, 0, 0)

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)
        self.running.pop(request_id, None)
        if request_id in self.waiting:
            self.waiting.remove(request_id)

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        self.is_shut_down = True

    async def generate(self, request_id: str, prompt: str | list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
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
        self.waiting.append(request_id)
        try:
            while not self.gate.is_set() or len(self.running) >= self.max_num_seqs:
                if request_id in self.aborted:
                    return
                await asyncio.sleep(0.005)
            self.waiting.remove(request_id)
            self.running[request_id] = math.ceil(len(ids) / self.block_size)
            async for out in self._decode(request_id, ids, params):
                yield out
        finally:
            self.running.pop(request_id, None)
            if request_id in self.waiting:
                self.waiting.remove(request_id)

    async def _decode(self, request_id: str, ids: list[int],
                      params: SamplingParams) -> AsyncIterator[RequestOutput]:
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
                token = LETTERS[(LETTERS.index(last) + 1) % len(LETTERS)] if last in LETTERS \
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
