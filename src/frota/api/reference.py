"""The InferenceService API reference (docs/api.md), generated from the pydantic models.

Like crds/, the page is never edited by hand: `python -m frota.api.reference -o docs/api.md`
rewrites it, and a test fails when it is stale. It walks pydantic's JSON Schema (the one
`frota.api.crd` makes structural), one section per model class, in the order a reader
meets them from the top of the object: every field with its type, default, constraints
and description, and each class's cross-field (CEL) rules.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

from frota.api.contract import API_VERSION, CATEGORIES, KIND, PLURAL, SHORT_NAMES
from frota.api.crd import PRINTER_COLUMNS
from frota.api.resource import MAX_NAME_LENGTH, InferenceService
from frota.api.types import PERCENT_PATTERN, QUANTITY_PATTERN
from frota.api.yamlio import write_out

COMMAND = "python -m frota.api.reference -o docs/api.md"
# Metadata belongs to the apiserver; the reference says what Frota requires of it in one row.
SKIPPED = {"ObjectMeta"}

INTRO = f"""\
# InferenceService API reference

<!-- Generated from the pydantic models in frota.api by `{COMMAND}`; do not edit. -->

`{API_VERSION}`, kind `{KIND}`: plural `{PLURAL}`, short name {", ".join(f"`{n}`" for n in SHORT_NAMES)},
category {", ".join(f"`{c}`" for c in CATEGORIES)}, namespaced. The `status` subresource is written
by the operator; the `scale` subresource reads `.spec.replicas`, `.status.replicas` and
`.status.selector`, so `kubectl scale fisvc NAME --replicas N` and HorizontalPodAutoscalers work.

This page lists every field of the object. The same schema, with the same descriptions, is the
CustomResourceDefinition in `crds/` (`kubectl explain inferenceservice.spec --recursive` prints
it from a cluster). For what the fields do together, with examples, see
[Writing an InferenceService](operations.md#writing-an-inferenceservice).

"Default" is what the apiserver fills in when a field is left out; an object's default is the
defaults of its own fields. "Rules" are checked by the apiserver (CEL) and again by the operator.
"""


def _defs() -> tuple[dict[str, Any], dict[str, Any]]:
    raw = InferenceService.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    # An enum (a StrEnum of the contract) reads best inline, as its values, not as a section.
    enums = {f"#/$defs/{k}": v for k, v in defs.items() if "enum" in v}

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("$ref") in enums:
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return {**enums[node["$ref"]], **rest}
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    root = inline({k: v for k, v in raw.items() if k != "$defs"})
    return root, {k: inline(v) for k, v in defs.items() if "enum" not in v}


def _ref_name(node: dict[str, Any]) -> str | None:
    if "$ref" in node:
        return node["$ref"].split("/")[-1]
    return None


def _unwrap(node: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the schema without its `null` branch, whether null was allowed)."""
    branches = node.get("anyOf")
    if not branches or not any(b.get("type") == "null" for b in branches):
        return node, False
    rest = [b for b in branches if b.get("type") != "null"]
    merged = {k: v for k, v in node.items() if k != "anyOf"}
    if len(rest) == 1:
        return {**rest[0], **merged}, True
    return {**merged, "anyOf": rest}, True


def anchor(name: str) -> str:
    """The GitHub anchor of a `### Name` heading."""
    return re.sub(r"[^a-z0-9 -]", "", name.lower()).replace(" ", "-")


def _type(node: dict[str, Any]) -> str:
    node, _ = _unwrap(node)
    ref = _ref_name(node)
    if ref:
        return "object" if ref in SKIPPED else f"[{ref}](#{anchor(ref)})"
    if node.get("x-kubernetes-int-or-string"):
        return {QUANTITY_PATTERN: "quantity", PERCENT_PATTERN: "integer or percent"}.get(
            node.get("pattern", ""), "integer or string")
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (any fields)"
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type")
    if kind == "array":
        return "list of " + _type(node.get("items", {}))
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "map of string to " + _type(node["additionalProperties"])
    return str(kind or "any")


def _default(node: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in node:
        kind = _unwrap(node)[0].get("type")
        return "empty" if kind in ("array", "object") else "unset"
    value = node["default"]
    if value is None:
        return "unset"
    if isinstance(value, dict) and value:
        return "its fields' defaults"
    return f"`{json.dumps(value)}`"


def _constraints(node: dict[str, Any]) -> list[str]:
    node, _ = _unwrap(node)
    out = []
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None:
        out.append(f"{low} to {high}")
    elif low is not None:
        out.append(f"at least {low}")
    elif high is not None:
        out.append(f"at most {high}")
    if node.get("minLength") == 1:
        out.append("not empty")
    elif node.get("minLength"):
        out.append(f"at least {node['minLength']} characters")
    if "maxLength" in node and not node.get("x-kubernetes-int-or-string"):
        out.append(f"at most {node['maxLength']} characters")
    if "maxItems" in node:
        out.append(f"at most {node['maxItems']} items")
    if node.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(f"`{k}`" for k in node.get("x-kubernetes-list-map-keys", []))
        out.append(f"one item per {keys}")
    if "pattern" in node and not node.get("x-kubernetes-int-or-string"):
        out.append(f"matches `{node['pattern']}`")
    return out


def _cell(text: str) -> str:
    """Markdown for a table cell: `|` escaped everywhere, `<` and `>` outside code spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|").replace("\n", " ")


def _children(node: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(suffix, class name) of every model class a field leads to."""
    node, _ = _unwrap(node)
    ref = _ref_name(node)
    if ref:
        yield "", ref
    if node.get("type") == "array":
        for suffix, name in _children(node.get("items", {})):
            yield "[]" + suffix, name


def _walk(root: dict[str, Any], defs: dict[str, Any]) -> tuple[list[str], dict[str, list[str]]]:
    """Class names in reading order, and every path of each.

    The order is breadth first under each top-level field in turn, so the spec's
    types all come before the status's.
    """
    order: list[str] = [KIND]
    paths: dict[str, list[str]] = {KIND: [""]}
    for top, top_schema in root.get("properties", {}).items():
        queue: list[tuple[str, dict[str, Any]]] = [("", {"properties": {top: top_schema}})]
        while queue:
            prefix, schema = queue.pop(0)
            for field, sub in schema.get("properties", {}).items():
                for suffix, name in _children(sub):
                    if name in SKIPPED:
                        continue
                    path = f"{prefix}.{field}{suffix}".lstrip(".")
                    if name not in paths:
                        order.append(name)
                        paths[name] = []
                    paths[name].append(path)
                    queue.append((path, defs[name]))  # the schema is a tree: every path once
    return order, paths


def _section(name: str, schema: dict[str, Any], paths: list[str]) -> list[str]:
    lines = [f"### {name}", ""]
    where = [f"`{p}`" for p in paths if p]
    if schema.get("description"):
        lines.append(schema["description"])
        lines.append("")
    if where:
        lines += ["At " + ", ".join(where) + ".", ""]
    lines += ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
    required = set(schema.get("required", []))
    for field, sub in schema.get("properties", {}).items():
        description = sub.get("description", "")
        if field == "metadata":
            description += (f" `name` is a DNS label of at most {MAX_NAME_LENGTH} characters "
                            "(child objects add suffixes to it).")
        extra = _constraints(sub)
        if extra:
            description = f"{description} ({'; '.join(extra)})".strip()
        lines.append(
            f"| `{field}` | {_type(sub)} | {_default(sub, field in required)} | {_cell(description)} |"
        )
    rules = schema.get("x-kubernetes-validations", [])
    if rules:
        lines += ["", "Rules:", ""]
        lines += [f"- {_cell(rule['message'])}" for rule in rules]
    lines.append("")
    return lines


def _printer_columns() -> list[str]:
    lines = ["## `kubectl get fisvc` columns", "", "| Column | From | Meaning |", "| --- | --- | --- |"]
    for column in PRINTER_COLUMNS:
        lines.append(f"| {column['name']} | `{_cell(column['jsonPath'])}` | "
                     f"{_cell(column.get('description', 'Time since creation.'))} |")
    return [*lines, ""]


def render() -> str:
    """The whole of docs/api.md."""
    root, defs = _defs()
    order, paths = _walk(root, defs)
    lines = [INTRO, *_printer_columns(), "## Types", ""]
    for name in order:
        lines += _section(name, root if name == KIND else defs[name], paths[name])
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the API reference (docs/api.md) generated from the pydantic models."""
    parser = argparse.ArgumentParser(prog="python -m frota.api.reference", description=main.__doc__)
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    args = parser.parse_args(argv)
    write_out(render(), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
