"""The README's field map names every top-level spec field (the schema is the full reference)."""

from __future__ import annotations

from pathlib import Path

from frota.api import InferenceServiceSpec

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_field_map_covers_every_spec_field():
    section = README[README.index("## The InferenceService API"):README.index("## Deploying to a cluster")]
    missing = [name for name in InferenceServiceSpec.model_fields if f"`{name}" not in section]
    assert missing == []
