"""The `frota` entry point stays importable without torch-heavy subcommands."""

import subprocess
import sys


def test_frota_help_lists_subcommands_and_exits_zero():
    out = subprocess.run(
        [sys.executable, "-m", "frota.cli.main", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "usage: frota" in out.stdout


def test_unknown_subcommand_is_rejected_with_usage():
    out = subprocess.run(
        [sys.executable, "-m", "frota.cli.main", "no-such-command"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "invalid choice" in out.stderr
