"""`response_format` -> an engine constraint (kind, text), and the JSON Schema subset it accepts.

The grammar library (xgrammar) silently ignores keywords it cannot enforce; a client asking
for `uniqueItems` would get duplicates without a word. So every schema is walked here first
and any keyword outside the subset below is refused with a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Any

from frota.server import errors

# Keywords the grammar enforces (tests/server/test_structured_outputs.py checks outputs).
ENFORCED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "pattern", "minLength", "maxLength",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "$ref", "$defs",
    "definitions",
}
# Keywords that say nothing about which instances are valid.
ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "strict",
}
TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}
_HINTS = {
    "oneOf": "use anyOf",
    "allOf": "merge the subschemas into one",
    "format": "use pattern",
    "uniqueItems": "drop it or check uniqueness after parsing",
}


def unsupported_keywords(schema: Any, path: str = "") -> list[str]:
    """Where the schema uses what the grammar cannot enforce, as `path.keyword` strings."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return [f"{path or '<root>'} (a schema must be an object or a boolean)"]
    found: list[str] = []
    for key, value in schema.items():
        where = f"{path}.{key}" if path else key
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            found.append(where)
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                found.append(f"{where} (must be an object)")
                continue
            for name, sub in value.items():
                found += unsupported_keywords(sub, f"{where}.{name}")
        elif key in ("items", "additionalProperties"):
            found += unsupported_keywords(value, where)
        elif key in ("anyOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                found.append(f"{where} (must be a non-empty list)")
                continue
            for i, sub in enumerate(value):
                found += unsupported_keywords(sub, f"{where}[{i}]")
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            found.append(f"{where} (only local references, '#/...', are supported)")
        elif key == "type":
            kinds = value if isinstance(value, list) else [value]
            found += [f"{where} ({k!r} is not a JSON type)" for k in kinds if k not in TYPES]
    return found


def check_schema(schema: Any, param: str, what: str) -> None:
    """400 naming every keyword outside the supported subset."""
    bad = unsupported_keywords(schema)
    if not bad:
        return
    hints = sorted({f"{k}: {h}" for k, h in _HINTS.items()
                    if any(b.rsplit(".", 1)[-1].split(" ")[0] == k for b in bad)})
    hint = f" ({'; '.join(hints)})" if hints else ""
    raise errors.invalid(
        f"{what} uses JSON Schema keywords this server cannot enforce: {', '.join(bad)}{hint}. "
        f"Supported: {', '.join(sorted(ENFORCED))}, plus annotations "
        f"({', '.join(sorted(ANNOTATIONS))}). See docs/structured-outputs.md.",
        param=param, code="unsupported_schema")


def response_format_constraint(response_format: dict[str, Any] | None) -> tuple[str, str] | None:
    """(kind, text) for the engine, None for plain text; 400 naming `response_format`."""
    if not response_format:
        return None
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object", ""
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict | bool):
            raise errors.invalid("`response_format.json_schema.schema` must be a JSON schema "
                                 "object.", param="response_format")
        schema = spec["schema"]
        check_schema(schema, "response_format", "`response_format.json_schema.schema`")
        return "json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    raise errors.invalid(f"`response_format.type` must be text, json_object or json_schema, "
                         f"got {kind!r}.", param="response_format")
