"""A hypothesis strategy for JSON schemas within the supported subset
(docs/structured-outputs.md): nested objects, bounded arrays, enum, const, anyOf,
patterns, integer and number bounds, required, additionalProperties false. Sizes are
bounded so that every schema can be met in a few hundred tokens."""

from __future__ import annotations

import json

from hypothesis import strategies as st

NAMES = st.sampled_from(["id", "name", "kind", "score", "tags", "ok", "city", "n"])
PATTERNS = ["^[a-z]{1,6}$", "^[A-Z]{2}-[0-9]{2}$", "^(yes|no)$"]


def _bounded(kind: str):  # type: ignore[no-untyped-def]
    lo = st.integers(-50, 50)
    return st.tuples(lo, st.integers(0, 100)).map(
        lambda b: {"type": kind, "minimum": b[0], "maximum": b[0] + b[1]})


LEAVES = st.one_of(
    st.builds(lambda n, m: {"type": "string", "minLength": min(n, m), "maxLength": m},
              st.integers(0, 3), st.integers(1, 8)),
    st.sampled_from(PATTERNS).map(lambda p: {"type": "string", "pattern": p}),
    _bounded("integer"),
    st.builds(lambda lo, w: {"type": "number", "exclusiveMinimum": lo, "maximum": lo + w},
              st.integers(-10, 10), st.integers(1, 20)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(st.one_of(st.sampled_from(["red", "green", "blue"]), st.integers(0, 9)),
             min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}),
    st.sampled_from(["fixed", 7, True]).map(lambda v: {"const": v}),
)


def objects(children):  # type: ignore[no-untyped-def]
    return st.dictionaries(NAMES, children, min_size=1, max_size=3).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props))).map(
            lambda req: {"type": "object", "properties": props, "required": sorted(req),
                         "additionalProperties": False}))


def _array(children):  # type: ignore[no-untyped-def]
    return st.tuples(children, st.integers(0, 2), st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]})


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        objects(children), _array(children),
        st.lists(children, min_size=2, max_size=2).map(lambda s: {"anyOf": s})),
    max_leaves=6,
).filter(lambda s: len(json.dumps(s)) < 600)


OBJECT_SCHEMAS = objects(SCHEMAS)
