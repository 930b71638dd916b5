"""What the docs tests read out of a Markdown file: code spans, shell command lines, links, headings.

Every item keeps its document and line, so a failing check can say where the name was written.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")
_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# Tokens that separate the commands of one shell line.
_SEPARATORS = {"&&", "||", "|", ";", "&"}


@dataclass(frozen=True)
class Item:
    """One thing written in a doc: `text`, at `line` of `doc` (relative to the repository)."""

    doc: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Doc:
    """A parsed Markdown file."""

    path: Path
    name: str  # relative to the repository root, for messages
    spans: list[Item]  # inline code spans, outside fences
    fence_lines: list[tuple[str, Item]]  # (fence language, line) inside fenced blocks
    commands: list[Item]  # shell command lines: from shell fences and from spans
    links: list[Item]  # link and image targets, outside code
    headings: list[str]


def parse(path: Path, root: Path) -> Doc:
    doc = Doc(path, str(path.relative_to(root)), [], [], [], [], [])
    fence: str | None = None
    fence_lang = ""
    block: list[Item] = []
    pending: list[tuple[int, str]] = []  # prose lines joined while a code span is still open
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                if fence_lang in SHELL_FENCES:
                    doc.commands.extend(_block_commands(block))
                fence, block = None, []
                continue
            doc.fence_lines.append((fence_lang, Item(doc.name, number, line)))
            block.append(Item(doc.name, number, line))
            continue
        if opened:
            fence, fence_lang = opened.group(1), opened.group(2).lower()
            continue
        heading = _HEADING.match(line)
        if heading:
            doc.headings.append(heading.group(2))
        pending.append((number, line))
        text = " ".join(part for _, part in pending)
        if _open_span(text) and len(pending) < 4:
            continue
        first = pending[0][0]
        pending = []
        _prose(doc, first, text)
    return doc


def _block_commands(block: list[Item]) -> Iterator[Item]:
    """The commands of a shell fence. With `$ ` prompts (a console), only the prompted lines
    are commands, the rest is output; a line ending in a backslash continues on the next."""
    prompted = any(item.text.startswith("$ ") for item in block)
    start: Item | None = None
    text = ""
    for item in block:
        if start is None:
            if prompted and not item.text.startswith("$ "):
                continue
            start, text = item, ""
        text += " " + item.text.rstrip().removesuffix("\\")
        if not item.text.rstrip().endswith("\\"):
            yield from _commands(Item(start.doc, start.line, text.strip()))
            start = None


def _open_span(text: str) -> bool:
    """Whether a single-backtick code span is still open at the end of `text`."""
    return len(re.sub(r"``+", "", text).split("`")) % 2 == 0


def _prose(doc: Doc, number: int, text: str) -> None:
    for match in _SPAN.finditer(text):
        span = match.group(2).strip()
        item = Item(doc.name, number, span)
        doc.spans.append(item)
        if looks_like_command(span):
            doc.commands.extend(_commands(item))
    for match in _LINK.finditer(_SPAN.sub("", text)):
        doc.links.append(Item(doc.name, number, match.group(1)))


def looks_like_command(text: str) -> bool:
    first = text.split(maxsplit=1)[0] if text.split() else ""
    return first in ("frota", "python", "python3", ".venv/bin/python", ".venv/bin/frota") or (
        "/" in first and first.endswith((".sh", ".py")))


def _commands(item: Item) -> Iterator[Item]:
    """Each command of a shell line as its own item (prompt, comments and pipes taken apart)."""
    text = re.sub(r"^\s*\$\s+", "", item.text)
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote (a heredoc, a quoted program): keep the words
        tokens = text.split("#", 1)[0].split()
    command: list[str] = []
    for token in [*tokens, ";"]:
        if token in _SEPARATORS:
            if command:
                yield Item(item.doc, item.line, shlex.join(command))
            command = []
        else:
            command.append(token)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
