"""Tokenizers: byte-level BPE from GGUF metadata or tokenizer.json (run by `tokenizers`), and a
byte tokenizer for synthetic models. Chat templates are rendered with jinja2."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import jinja2
import jinja2.sandbox

if TYPE_CHECKING:
    import tokenizers


def _render_template(template: str, messages: list[dict], add_generation_prompt: bool, **extra) -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **extra
    )


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special ids and chat template the engine needs."""

    def __init__(
        self,
        backend,  # tokenizers.Tokenizer
        eos_token_ids: Sequence[int],
        bos_token_id: int | None = None,
        add_bos_token: bool = False,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _token(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render OpenAI-style messages into the prompt text the model was trained on."""
        if not self.chat_template:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text + ("assistant: " if add_generation_prompt else "")
        return _render_template(
            self.chat_template, messages, add_generation_prompt,
            bos_token=self._token(self.bos_token_id),
            eos_token=self._token(self.eos_token_ids[0] if self.eos_token_ids else None),
        )


class ByteTokenizer:
    """Bytes are tokens 0..255; 256 is BOS and 257 EOS. Ids above that decode to nothing."""

    BOS = 256
    EOS = 257
    CHAT_TEMPLATE = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self.eos_token_ids: tuple[int, ...] = (self.EOS,)
        self.bos_token_id = self.BOS
        self.chat_template = self.CHAT_TEMPLATE

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return _render_template(self.CHAT_TEMPLATE, messages, add_generation_prompt)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def byte_level_bpe(tokens: list[str], merges: list[str],
                   token_types: list[int] | None) -> tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` for a GPT-2 style vocabulary, as stored in GGUF metadata."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(tokens)
    }
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    if token_types:
        control = [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, token_types, strict=True)
            if kind == 3 and set(t) <= alphabet
        ]
        backend.add_special_tokens(control)
    return backend
