"""Turn the pydantic models into the InferenceService CustomResourceDefinition.

Pydantic's JSON Schema is close to what the apiserver wants; this module makes
it structural: references inlined, `Optional` unions collapsed to the inner
type (absent, never null), `additionalProperties: false` dropped (the apiserver
rejects or prunes unknown fields by itself), titles dropped.
"""

from __future__ import annotations

import copy
from typing import Any

from frota.api.contract import (
    API_VERSION,
    APP_NAME,
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    Label,
)
from frota.api.resource import InferenceService

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
     "description": "Whether every replica of the current revision serves."},
    {"name": "Replicas", "type": "string", "jsonPath": ".status.readyOfReplicas",
     "description": "Ready of existing replicas (units when disaggregated): 0/0 at zero."},
    {"name": "Mode", "type": "string", "jsonPath": ".status.mode", "description": "Colocated or Disaggregated."},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "description": "Served model name."},
    {"name": "URL", "type": "string", "jsonPath": ".status.url", "description": "OpenAI base URL."},
    {"name": "Cache", "type": "string", "jsonPath": ".status.modelCache.progress", "priority": 1,
     "description": "The shared model cache (spec.model.cache): Downloading with percent and bytes, Ready, Failed; with -o wide."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        # The field's own description and default win over the class docstring.
        return _inline({**target, **siblings}, defs)
    return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    node.pop("title", None)
    any_of = node.get("anyOf")
    if any_of and any(branch.get("type") == "null" for branch in any_of):
        rest = [branch for branch in any_of if branch.get("type") != "null"]
        node.pop("anyOf")
        if node.get("default", "absent") is None:
            node.pop("default")
        if len(rest) == 1:
            node = {**rest[0], **{k: v for k, v in node.items() if k != "type"}}
        else:
            node["anyOf"] = rest
    node.pop("title", None)
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")
    if node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" in node:
        node.pop("additionalProperties")
    if "properties" in node or node.get("x-kubernetes-preserve-unknown-fields"):
        node.setdefault("type", "object")
    return {k: (_structural(v) if k != "properties" else {pk: _structural(pv) for pk, pv in v.items()})
            for k, v in node.items()}


def openapi_schema() -> dict[str, Any]:
    """The structural OpenAPI v3 schema of an InferenceService."""
    raw = InferenceService.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(_inline(raw, raw.get("$defs", {})))
    props = schema["properties"]
    # metadata belongs to the apiserver: a CRD may say nothing about it but its type.
    props["metadata"] = {"type": "object"}
    props["apiVersion"] = {"type": "string", "description": API_VERSION}
    props["kind"] = {"type": "string", "description": KIND}
    schema["required"] = ["spec"]
    return schema


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object (what `frota crd` prints and crds/ holds)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {Label.NAME: APP_NAME, Label.COMPONENT: "crd"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }
