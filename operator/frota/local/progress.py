"""What `frota up` prints: its own progress lines and each process's log, prefixed."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

from frota.local.supervisor import ManagedProcess

_COLORS = ("36", "33", "35", "32", "34", "31")  # cyan, yellow, magenta, green, blue, red


class Progress:
    """Compact, prefixed lines: `[up] ...` for frota up, `[worker-0] ...` for a process.

    On a terminal, names are coloured and long log lines are cut to the
    terminal's width; piped output keeps whole lines (for files and CI logs).
    `show_logs=False` keeps only frota up's own lines (a failing process's
    last lines are still shown).
    """

    def __init__(self, names: list[str], stream: TextIO | None = None,
                 show_logs: bool = True) -> None:
        self.stream = stream or sys.stdout
        self.show_logs = show_logs
        self.is_tty = self.stream.isatty()
        self.width = max([len(n) for n in names] + [2])
        self._colors = {n: _COLORS[i % len(_COLORS)] for i, n in enumerate(names)}
        self.started = time.monotonic()

    def _write(self, name: str, text: str, *, cut: bool) -> None:
        tag = f"[{name}]".ljust(self.width + 2)
        if cut and self.is_tty:
            room = max(20, shutil.get_terminal_size().columns - len(tag) - 1)
            if len(text) > room:
                text = text[: room - 1] + "…"
        if self.is_tty:
            tag = f"\x1b[{self._colors.get(name, '1')}m{tag}\x1b[0m"
        print(f"{tag} {text}", file=self.stream, flush=True)

    def info(self, text: str) -> None:
        """A frota up line."""
        self._write("up", text, cut=False)

    def log(self, member: ManagedProcess, line: str) -> None:
        """One line of a process's output."""
        if self.show_logs and line.strip():
            self._write(member.spec.name, line, cut=True)

    def event(self, kind: str, member: ManagedProcess, detail: str) -> None:
        """A supervisor event (started, ready, exited, killed) as one line."""
        name = member.spec.name
        if kind == "started":
            where = f", port {member.spec.port}" if member.spec.port else ""
            again = f" (restart {member.num_restarts})" if member.num_restarts else ""
            self.info(f"{name} starting ({detail}{where}){again}")
        elif kind == "ready":
            self.info(f"{name} ready in {detail}")
        elif kind == "exited":
            self.info(f"{name} exited ({detail})")
        elif kind == "killed":
            self.info(f"{name} killed: {detail}")

    def tail(self, name: str, lines: list[str]) -> None:
        """The last lines of a failed process, always shown."""
        for line in lines[-20:]:
            self._write(name, line, cut=False)
