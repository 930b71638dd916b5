"""Grammar-constrained decoding with xgrammar: constraints, their compiled grammars, matchers.

A `Constraint` (kind, text) rides on SamplingParams. The engine's `Grammars` compiles it at
admission (once per distinct constraint: an LRU cache keyed by kind and canonical text), so
a grammar that cannot be compiled is refused before the request is queued, and gives each
sequence its own `Matcher`. The sampler masks each constrained row's logits to the tokens
its matcher allows; `Sequence.append_token` advances the matcher, so the matcher's state is
always that of the sequence's generated tokens (recompute after preemption only recomputes
KV and never appends, so it never re-advances it).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from frota.engine.errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

ConstraintKind = Literal["json_object", "json_schema", "regex", "ebnf", "structural_tag"]
KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "ebnf", "structural_tag")
# Compact JSON only: free whitespace lets a small model loop on newlines until max_tokens.
_SEPARATORS = (", ", ": ")


@dataclass(frozen=True)
class Constraint:
    """What the generated text must match. `value`: the schema as canonical JSON text
    (`Constraint.json_schema`), a regex, an EBNF grammar, or a structural tag as JSON text;
    unused for json_object (any JSON object)."""

    kind: ConstraintKind
    value: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Constraint:
        return cls("json_schema", canonical_json(schema))

    @classmethod
    def structural_tag(cls, tag: dict[str, Any]) -> Constraint:
        return cls("structural_tag", canonical_json(tag))

    @property
    def param(self) -> str:
        """The API field a compile error is reported against."""
        return "tools" if self.kind == "structural_tag" else "response_format"


def canonical_json(obj: Any) -> str:
    # Key order is kept: properties are generated in the order the schema lists them.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _encoded_vocab(tokenizer: Any, vocab_size: int) -> tuple[list[str] | list[bytes], str]:
    """The vocabulary as xgrammar reads it, and its encoding. Special tokens are left empty,
    which xgrammar treats as never-allowed (else `<|im_start|>` could appear inside a JSON
    string, since its spelling is plain text)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:  # ByteTokenizer: bytes 0..255, the rest specials
        return [bytes([i]) for i in range(256)] + [b""] * (vocab_size - 256), "RAW"
    vocab: list[str] = [""] * vocab_size
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            vocab[i] = token
    for i in backend.get_added_tokens_decoder():
        if i < vocab_size:
            vocab[i] = ""
    return vocab, "BYTE_LEVEL"


def _control_tokens(vocab: list[str] | list[bytes], vocab_type: str) -> list[int]:
    """Tokens that hold a raw control character (U+0000-U+001F). JSON forbids them
    unescaped in strings, but xgrammar's JSON grammar excludes only CR and LF there, so a
    model could write a BEL into a "valid" string that no strict JSON parser accepts.
    Compact JSON never needs them (a newline in a string is written `\\n`). A byte-level
    vocabulary spells byte b < 0x20 as chr(256 + b)."""
    if vocab_type == "RAW":
        return [i for i, t in enumerate(vocab) if any(b < 0x20 for b in t)]  # type: ignore[union-attr]
    return [i for i, t in enumerate(vocab) if any(256 <= ord(ch) < 288 for ch in t)]  # type: ignore[arg-type]


class Matcher:
    """One sequence's position in its grammar."""

    def __init__(self, matcher: Any, grammars: Grammars, json_text: bool = False) -> None:
        self._matcher = matcher
        self.grammars = grammars  # whose vocabulary the bitmask covers
        self.json_text = json_text  # the whole output is JSON: no raw control characters
        self.is_failed = False

    def accept(self, token_id: int) -> None:
        if not self.is_failed and not self._matcher.is_terminated():
            self.is_failed = not self._matcher.accept_token(token_id)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was taken (or a token was refused)."""
        return self.is_failed or self._matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)


class Grammars:
    """The compiler for one tokenizer, and an LRU cache of compiled grammars."""

    def __init__(self, tokenizer: Any, cache_size: int = 256, max_threads: int = 2) -> None:
        import torch
        import xgrammar as xgr

        self._xgr = xgr
        vocab, vocab_type = _encoded_vocab(tokenizer, tokenizer.vocab_size)
        self.vocab_size = tokenizer.vocab_size  # the model's logits may have more columns
        self.control_ids = torch.tensor(_control_tokens(vocab, vocab_type), dtype=torch.long)
        self.info = xgr.TokenizerInfo(vocab, getattr(xgr.VocabType, vocab_type),
                                      vocab_size=self.vocab_size,
                                      stop_token_ids=list(tokenizer.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads,
                                            cache_enabled=False)
        self.cache_size = cache_size
        self._cache: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, constraint: Constraint) -> Any:
        """The compiled grammar; raises InvalidRequestError naming what could not compile."""
        with self._lock:
            if constraint in self._cache:
                self._cache.move_to_end(constraint)
                return self._cache[constraint]
        compiled = self._compile(constraint)
        with self._lock:
            self._cache[constraint] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, c: Constraint) -> Any:
        comp = self.compiler
        try:
            if c.kind == "json_object":
                return comp.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                separators=_SEPARATORS)
            if c.kind == "json_schema":
                return comp.compile_json_schema(c.value, any_whitespace=False,
                                                separators=_SEPARATORS)
            if c.kind == "regex":
                return comp.compile_regex(c.value)
            if c.kind == "ebnf":
                return comp.compile_grammar(c.value)
            if c.kind == "structural_tag":
                return comp.compile_structural_tag(c.value)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with its reason
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            reason = reason.split(": ", 1)[-1] if reason.startswith("[") else reason
            raise InvalidRequestError(
                f"The {c.kind} constraint cannot be compiled: {reason}", c.param) from exc
        raise InvalidRequestError(f"unknown constraint kind {c.kind!r}; one of {KINDS}", c.param)

    def matcher(self, constraint: Constraint) -> Matcher:
        return Matcher(self._xgr.GrammarMatcher(self.compile(constraint)), self,
                       json_text=constraint.kind in ("json_object", "json_schema"))

    def mask_logits(self, logits: torch.Tensor, rows: list[int], matchers: list[Matcher]) -> None:
        """Set every token a row's matcher disallows to -inf, in place; the columns past the
        tokenizer's vocabulary too."""
        import torch

        xgr = self._xgr
        bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for j, m in enumerate(matchers):
            m.fill(bitmask, j)
        index = torch.tensor(rows, device=logits.device)
        sub = logits[index, : self.vocab_size].contiguous()
        xgr.apply_token_bitmask_inplace(sub, bitmask.to(logits.device))
        logits[index, : self.vocab_size] = sub
        json_rows = [r for r, m in zip(rows, matchers, strict=True) if m.json_text]
        if json_rows and len(self.control_ids):
            ids = self.control_ids.to(logits.device)
            logits[torch.tensor(json_rows, device=logits.device).unsqueeze(1), ids] = float("-inf")
        if logits.shape[1] > self.vocab_size:
            logits[index, self.vocab_size :] = float("-inf")


def mask_constrained(logits: torch.Tensor, seqs: list) -> None:
    """The sampler's hook: mask the rows of sequences that carry a matcher; others untouched."""
    rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
    if rows:
        matchers = [seqs[i].matcher for i in rows]
        matchers[0].grammars.mask_logits(logits, rows, matchers)
