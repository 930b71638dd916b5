"""`synthetic:` model specs: seeded random models of any shape, dense or MoE.

Spec: `synthetic:PRESET[,key=value...]` or `synthetic:key=value,...` (preset
dense-tiny). The one parser of the spec, torch-free: the planner reads a synthetic
model's shape with it, the engine (`frota.engine.loader.synthetic`) builds the
model from it.
"""

from __future__ import annotations

from collections.abc import Mapping

from frota.api.memory import ModelShape

PRESETS: dict[str, dict[str, int]] = {
    "dense-tiny": dict(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=320),
    "moe-tiny": dict(layers=2, hidden=64, intermediate=96, heads=4, kv_heads=2, vocab=320,
                     experts=4, top_k=2),
    "dense-small": dict(layers=4, hidden=256, intermediate=512, heads=8, kv_heads=4, vocab=1024),
    "moe-small": dict(layers=4, hidden=256, intermediate=256, heads=8, kv_heads=4, vocab=1024,
                      experts=8, top_k=2),
}
KEYS = frozenset({"layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab",
                  "experts", "top_k", "max_len", "rope_theta", "tie", "seed"})
# A byte tokenizer: 256 bytes plus BOS and EOS.
MIN_VOCAB = 258


class SyntheticSpecError(ValueError):
    """A `synthetic:` spec that names no model (the message says what is wrong)."""


def parse_synthetic_spec(spec: str) -> dict[str, int | float]:
    """The preset's values with the spec's keys applied: `rope_theta` a float, the rest
    ints. Raises `SyntheticSpecError`."""
    values: dict[str, int | float] = dict(PRESETS["dense-tiny"])
    for i, part in enumerate(p.strip() for p in spec.split(",") if p.strip()):
        if "=" not in part:
            if i != 0 or part not in PRESETS:
                raise SyntheticSpecError(
                    f"unknown synthetic preset {part!r}; presets: {', '.join(PRESETS)}")
            values = dict(PRESETS[part])
            continue
        key, _, raw = part.partition("=")
        if key not in KEYS:
            raise SyntheticSpecError(
                f"unknown synthetic key {key!r}; keys: {', '.join(sorted(KEYS))}")
        try:
            values[key] = float(raw) if key == "rope_theta" else int(raw)
        except ValueError:
            raise SyntheticSpecError(f"synthetic key {key} must be a number, not {raw!r}") from None
    if values["vocab"] < MIN_VOCAB:
        raise SyntheticSpecError(f"synthetic vocab must be >= {MIN_VOCAB} (bytes + BOS + EOS)")
    if values["heads"] % values.get("kv_heads", values["heads"]):
        raise SyntheticSpecError("synthetic heads must be a multiple of kv_heads")
    return values


def synthetic_shape(values: Mapping[str, int | float]) -> ModelShape:
    """The shape of the model a parsed spec (`parse_synthetic_spec`) describes."""
    v = {k: int(x) for k, x in values.items() if k != "rope_theta"}
    return ModelShape(
        vocab_size=v["vocab"],
        hidden_size=v["hidden"],
        intermediate_size=v["intermediate"],
        num_layers=v["layers"],
        num_heads=v["heads"],
        num_kv_heads=v.get("kv_heads", v["heads"]),
        head_dim=v.get("head_dim", v["hidden"] // v["heads"]),
        tie_word_embeddings=bool(v.get("tie", 0)),
        num_experts=v.get("experts", 0),
        num_experts_per_tok=v.get("top_k", 2),
        max_position=v.get("max_len", 2048),
    )
