"""`frota render`, `frota plan` and `frota up --dry-run` print exactly what they printed
when these files were recorded, for every sample manifest.

The planner's refactors (its own package, one model shape, one role type) must not
change a byte of what users see. When a change is meant to alter the output, record
it again and review the diff:

    FROTA_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/golden
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
RECORDED = Path(__file__).resolve().parent / "recorded"
COMMANDS = {"render": ["render"], "plan": ["plan"], "up-dry-run": ["up", "--dry-run"]}


def _run(command: list[str], sample: Path) -> str:
    """Exit code, stdout and stderr as one text, with this checkout's paths made neutral.

    The vllm runtime's command is whatever $FROTA_VLLM or PATH finds on this machine
    (scripts/test.sh installs one), so it is pinned to plain `vllm` here.
    """
    env = {**os.environ, "FROTA_VLLM": "vllm"}
    out = subprocess.run([sys.executable, "-m", "frota.cli.main", command[0], str(sample), *command[1:]],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    text = f"# exit {out.returncode}\n# stdout\n{out.stdout}# stderr\n{out.stderr}"
    return text.replace(sys.executable, "PYTHON").replace(str(ROOT), "ROOT")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
def test_sample_output_is_unchanged(sample: Path, command: str) -> None:
    recorded = RECORDED / f"{sample.stem}.{command}.txt"
    actual = _run(COMMANDS[command], sample)
    if os.environ.get("FROTA_RECORD_GOLDEN") == "1":
        RECORDED.mkdir(exist_ok=True)
        recorded.write_text(actual)
    assert recorded.exists(), f"{recorded.name} is not recorded; see this module's docstring"
    assert actual == recorded.read_text()


def test_every_recording_has_a_sample() -> None:
    expected = {f"{s.stem}.{c}.txt" for s in SAMPLES for c in COMMANDS}
    assert {p.name for p in RECORDED.glob("*.txt")} == expected
