"""Turning an InferenceService manifest into a model, with errors that name the field."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from frota.api import KIND, InferenceService


@dataclass(frozen=True)
class FieldError:
    """One problem with a spec, at a field path such as `spec.parallelism.tensor`."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """The spec is invalid; `errors` says where and why."""

    def __init__(self, errors: Iterable[FieldError], subject: str | None = None) -> None:
        self.errors = tuple(errors)
        self.subject = subject  # e.g. "InferenceService tiny", when known
        super().__init__("\n".join(str(e) for e in self.errors))

    def about(self, subject: str) -> SpecError:
        """The same errors, attributed to an object."""
        return SpecError(self.errors, subject)

    def report(self) -> str:
        """What a CLI prints: the object, then one `field: message` line per error."""
        head = f"invalid spec ({self.subject})" if self.subject else "invalid spec"
        return head + ":\n" + "\n".join(f"  {e}" for e in self.errors)


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "tagged-union", "int", "str", "constrained")):
            out += ("." if out else "") + str(part)
    return out or "(root)"


def load(manifest: dict[str, Any]) -> InferenceService:
    """Validate a manifest against the API models; raise SpecError with field paths."""
    if not isinstance(manifest, dict):
        raise SpecError([FieldError("(root)", "expected a mapping (an InferenceService object)")])
    try:
        return InferenceService.from_manifest(manifest)
    except ValidationError as exc:
        raise SpecError(
            FieldError(_path(err["loc"]), err["msg"].removeprefix("Value error, "))
            for err in exc.errors()
        ) from None


def inference_services(documents: list[Any], namespace: str | None = None) -> list[InferenceService]:
    """The InferenceServices among YAML documents (others are skipped), validated; `namespace`
    for those whose manifest names none."""
    out = []
    for doc in documents:
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            continue
        if namespace and not doc.get("metadata", {}).get("namespace"):
            doc = {**doc, "metadata": {**doc.get("metadata", {}), "namespace": namespace}}
        try:
            out.append(load(doc))
        except SpecError as exc:
            name = (doc.get("metadata") or {}).get("name", "?")
            raise exc.about(f"InferenceService {name}") from None
    return out
