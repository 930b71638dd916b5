"""What the apiserver does to a custom resource, in Python: structural checks on the CRD
schema, defaulting, OpenAPI validation with unknown fields rejected, then the CEL rules.

Good enough to pin the CRD's behaviour without a cluster; the e2e suite applies the
same objects to a real apiserver.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema

ALLOWED_KEYWORDS = {
    "description", "type", "format", "default", "maximum", "minimum", "maxLength", "minLength",
    "pattern", "maxItems", "minItems", "uniqueItems", "multipleOf", "enum", "maxProperties",
    "minProperties", "required", "items", "allOf", "oneOf", "anyOf", "not", "properties",
    "additionalProperties", "nullable", "example", "title",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type", "x-kubernetes-embedded-resource",
}
INT_OR_STRING_BRANCHES = [{"type": "integer"}, {"type": "string"}]


def structural_problems(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Why a schema is not structural (the apiserver's rules, the ones our generator could break)."""
    for key in schema:
        if key not in ALLOWED_KEYWORDS:
            yield f"{path or '<root>'}: keyword {key!r} is not allowed in a CRD schema"
    if schema.get("x-kubernetes-int-or-string"):
        if schema.get("anyOf") not in (None, INT_OR_STRING_BRANCHES) or "type" in schema:
            yield f"{path}: int-or-string must be exactly anyOf [integer, string] with no type"
    elif "type" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        yield f"{path or '<root>'}: no type"
    elif "anyOf" in schema or "oneOf" in schema:
        yield f"{path}: anyOf/oneOf only with x-kubernetes-int-or-string here"
    if "properties" in schema and "additionalProperties" in schema:
        yield f"{path}: properties and additionalProperties are mutually exclusive"
    if not path and schema.get("properties", {}).get("metadata", {"type": "object"}) != {"type": "object"}:
        yield ".metadata: must be exactly {type: object} (the apiserver owns metadata)"
    for name, sub in schema.get("properties", {}).items():
        yield from structural_problems(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from structural_problems(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from structural_problems(schema["additionalProperties"], f"{path}{{}}")


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Fill in defaults top-down; a defaulted `{}` gets its own nested defaults too."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(sub, obj[name])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in obj]
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: apply_defaults(schema["additionalProperties"], v) for k, v in obj.items()}
    return obj


def _closed(schema: Any) -> Any:
    """The schema with unknown fields forbidden (kubectl's strict field validation)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()
           if k not in ("x-kubernetes-validations", "default")}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _cel_errors(schema: dict[str, Any], obj: Any, path: str, env: celpy.Environment) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(obj)})
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            yield f"{path or '<root>'}: {rule['message']}"
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                yield from _cel_errors(sub, obj[name], f"{path}.{name}", env)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            yield from _cel_errors(schema["items"], item, f"{path}[{i}]", env)


def admit(schema: dict[str, Any], obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Default, validate and run the CEL rules; returns the defaulted object and the errors."""
    obj = apply_defaults(schema, copy.deepcopy(obj))
    validator = jsonschema.Draft4Validator(_closed(schema))
    errors = [f".{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]
    if errors:
        return obj, errors  # the apiserver runs CEL only on schema-valid objects
    return obj, list(_cel_errors(schema, obj, "", celpy.Environment()))


def all_rules(schema: dict[str, Any]) -> Iterator[str]:
    """Every CEL rule in the schema."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield rule["rule"]
    for sub in schema.get("properties", {}).values():
        yield from all_rules(sub)
    if isinstance(schema.get("items"), dict):
        yield from all_rules(schema["items"])


def default_problems(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Defaults the apiserver would refuse: each is validated as written (no nested
    defaulting first) against its own schema, CEL rules included."""
    if "default" in schema:
        value = copy.deepcopy(schema["default"])
        for error in jsonschema.Draft4Validator(_closed(schema)).iter_errors(value):
            yield f"{path}.default: {error.message}"
        try:
            for error in _cel_errors(schema, value, path, celpy.Environment()):
                yield f"default: {error}"
        except Exception as exc:  # celpy raises on a missing key, as the apiserver does
            yield f"{path}.default: {exc}"
    for name, sub in schema.get("properties", {}).items():
        yield from default_problems(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from default_problems(schema["items"], f"{path}[]")
