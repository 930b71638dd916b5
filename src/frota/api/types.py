"""Building blocks shared by the InferenceService models: the base model, CEL rules, quantities."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# A Kubernetes resource quantity ("500m", "2Gi", 4). Written as a string in
# the CRD with the apiserver's int-or-string form, so `cpu: 2` is accepted.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti|Pi)?$"
PERCENT_PATTERN = r"^[0-9]+%$"


def _to_str(value: Any) -> Any:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


Quantity = Annotated[
    str,
    BeforeValidator(_to_str),
    Field(pattern=QUANTITY_PATTERN),
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
    }),
]

# A count or a percentage ("25%"). The int-or-string form allows no bounds
# inside the anyOf, so the CRD checks the sign with a CEL rule where it is used.
IntOrPercent = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=PERCENT_PATTERN)],
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": PERCENT_PATTERN,
        "maxLength": 8,
    }),
]


@dataclass(frozen=True)
class CelRule:
    """A cross-field rule the apiserver evaluates (`x-kubernetes-validations`).

    Each rule is mirrored by a pydantic validator on the same model, so the
    operator and `frota render` reject the same specs the apiserver does;
    tests evaluate both on the same objects.
    """

    rule: str
    message: str
    field_path: str | None = None

    def as_schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


class FrotaModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        if cls.cel_rules:
            target["x-kubernetes-validations"] = [r.as_schema() for r in cls.cel_rules]
        return schema

    def to_wire(self) -> dict[str, Any]:
        """The object as it appears in YAML/JSON (camelCase, unset optionals left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def nested_default(model: type[FrotaModel]) -> dict[str, Any]:
    """`json_schema_extra` giving an object field its whole default value.

    Not `{}`: the apiserver validates a default (CEL rules included) as written,
    without filling in the nested defaults first, so rules like
    `self.tensor % self.expert == 0` need the fields present.
    """
    return {"default": model().to_wire()}
