"""What `frota up` prints: its own progress lines and each process's log, prefixed."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from typing import TextIO

from frota.local.supervisor import ManagedProcess

_COLORS = ("36", "33", "35", "32", "34", "31")  # cyan, yellow, magenta, green, blue, red
# "2026-11-30 03:25:47,492 INFO frota.router.health: " (the logging module's default shape)
_LOGGING_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:,.]+ (\w+) [\w.]+: ")
_COUNTER = re.compile(r"\b(\d+)/(\d+)\b")
_QUIET_KEYS = {"ts", "time", "level", "logger", "msg", "message"}


def compact(line: str) -> tuple[str, str]:
    """(level, short text) of a log line: structured and timestamped lines lose their framing."""
    text = line.rstrip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            return "info", text
        if isinstance(record, dict) and ("msg" in record or "message" in record):
            msg = str(record.get("msg", record.get("message")))
            extras = " ".join(f"{k}={v}" for k, v in record.items() if k not in _QUIET_KEYS)
            return str(record.get("level", "info")).lower(), f"{msg}  {extras}".rstrip()
    if match := _LOGGING_PREFIX.match(text):
        return match.group(1).lower(), text[match.end():]
    return "info", text


class _CounterThrottle:
    """Keeps "loaded 27/272"-style progress to about one line per quarter."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}

    def keep(self, name: str, text: str) -> bool:
        match = _COUNTER.search(text)
        if not match or int(match.group(2)) < 8:
            return True
        done, total = int(match.group(1)), int(match.group(2))
        key = f"{name}:{_COUNTER.sub('#', text)}"
        quarter = 4 * done // total
        if done in (0, total) or quarter > self.last.get(key, -1):
            self.last[key] = quarter
            return True
        return False


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
        self._throttle = _CounterThrottle()

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
        """One line of a process's output, compacted."""
        if not self.show_logs or not line.strip():
            return
        level, text = compact(line)
        if not self._throttle.keep(member.spec.name, text):
            return
        if level not in ("info", "debug"):
            text = f"{level.upper()}: {text}"
        self._write(member.spec.name, text, cut=True)

    def event(self, kind: str, member: ManagedProcess, detail: str) -> None:
        """A supervisor event (started, ready, exited, killed) as one line."""
        name = member.spec.name
        if kind == "started":
            where = f", port {member.spec.port}" if member.spec.port else ""
            again = f" (restart {member.num_restarts})" if member.num_restarts else ""
            self.info(f"{name} starting ({detail}{where}){again}")
        elif kind == "ready" and member.spec.ready_url is None:
            self.info(f"{name} running (rank {member.spec.rank}: ready with its group's rank 0)")
        elif kind == "ready":
            self.info(f"{name} ready in {detail}")
        elif kind == "exited":
            self.info(f"{name} exited ({detail})")
        elif kind == "unhealthy":
            self.info(f"{name} is not live: {detail}")
        elif kind == "killed":
            self.info(f"{name} killed: {detail}")
        elif kind == "parked":
            self.info(f"{name} stopped ({detail})")

    def tail(self, name: str, lines: list[str]) -> None:
        """The last lines of a failed process, always shown."""
        for line in lines[-20:]:
            self._write(name, line, cut=False)
