"""docs/api.md is generated from the pydantic models and kept fresh, like crds/."""

from __future__ import annotations

from frota.api import InferenceServiceSpec
from frota.api.reference import COMMAND, render
from tests.docs.repo import ROOT

API_MD = ROOT / "docs" / "api.md"


def test_api_reference_matches_the_models():
    assert API_MD.read_text(encoding="utf-8") == render(), f"docs/api.md is stale: run `{COMMAND}`"


def test_api_reference_lists_every_spec_field():
    text = render()
    section = text[text.index("### InferenceServiceSpec"):]
    section = section[:section.index("\n### ", 1)]
    missing = [name for name in InferenceServiceSpec.model_fields if f"| `{name}` |" not in section]
    assert missing == []


def test_api_reference_documents_nested_fields_with_defaults():
    text = render()
    engine = text[text.index("### KVCache"):]
    assert "| `blockSize` | `8` \\| `16` \\| `32` | `16` |" in engine
    assert "At `spec.engine.kvCache`." in engine
