"""Where a model comes from: an alias, a path or a synthetic spec, resolved to a `ResolvedModel`."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from frota.api.contract import ALIAS_PACKAGES, ModelScheme
from frota.engine.errors import ModelNotFoundError


@dataclass
class ResolvedModel:
    """Where a model comes from: kind is 'gguf', 'safetensors' or 'synthetic'."""

    kind: str
    path: str  # file or directory; for synthetic, the spec after "synthetic:"


def resolve_model(model: str) -> ResolvedModel:
    """Map an alias, a path or a synthetic spec to a ResolvedModel, or say what is wrong."""
    if model.startswith(ModelScheme.SYNTHETIC):
        return ResolvedModel("synthetic", model.removeprefix(ModelScheme.SYNTHETIC))
    name = model.removeprefix(ModelScheme.ALIAS)
    if name in ALIAS_PACKAGES:
        weights = ALIAS_PACKAGES[name]
        package, filename, hint = weights.package, weights.file, weights.install
        # find_spec only locates the package; importing it would drag in its own dependencies.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(
                f"model alias {name!r} needs the package {package!r}, which is not installed: "
                f"run `{hint}`"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / filename
        if not path.is_file():
            raise ModelNotFoundError(f"model alias {name!r}: {path} is missing; reinstall with `{hint}`")
        return ResolvedModel("gguf", str(path))
    path = Path(os.path.expanduser(model))
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel("gguf", str(path))
    if path.is_dir():
        if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
            return ResolvedModel("safetensors", str(path))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ResolvedModel("gguf", str(ggufs[0]))
    raise ModelNotFoundError(
        f"model {model!r} not found: expected an alias ({', '.join(ALIAS_PACKAGES)}), a .gguf file, "
        "a directory with config.json and *.safetensors, or 'synthetic:...'"
    )
