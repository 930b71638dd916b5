"""YAML in and out: multi-document, block style, key order kept; generated text out to a file."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Indents lists under their key, the way kubectl prints them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # builders may share a dict between two places; print it twice

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
        return super().increase_indent(flow, False)


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style=style)


_Dumper.add_representer(str, _str_presenter)
_Dumper.add_multi_representer(str, _str_presenter)  # StrEnum members (roles, reasons) print as text


def dump_all(objects: Iterable[dict[str, Any]]) -> str:
    """Objects as one multi-document YAML stream (`---` between documents)."""
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         explicit_start=True, width=100)


def load_all(text: str) -> list[dict[str, Any]]:
    """Every non-empty document of a YAML stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def read_all(path: str) -> list[dict[str, Any]]:
    """Every non-empty document of a YAML file, or of stdin for '-'."""
    if path == "-":
        return load_all(sys.stdin.read())
    with open(path, encoding="utf-8") as fh:
        return load_all(fh.read())


def write_out(text: str, output: str | None) -> None:
    """`text` into the file `output` (`-o`), or onto stdout when None."""
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
