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


def test_the_engine_subcommands_parse_their_flags_without_torch():
    # `frota generate/eval/convert --help` reads only the contract's lists; the engine loads in run.
    code = ("import sys\n"
            "from frota.cli.main import main\n"
            "for argv in (['generate', '--help'], ['eval', 'ppl', '--help'], ['convert', '--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code == 0, argv\n"
            "sys.exit('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--quantization" in out.stdout and "--kv-cache-dtype" in out.stdout
    assert "{float32,bfloat16,float16}" in out.stdout  # convert's --dtype choices
