"""`frota worker` flags, each also readable from FROTA_<FLAG>."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from frota.server.cli import add_arguments, engine_kwargs, env_name, parse_size


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_env_supplies_flags_and_the_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROTA_MODEL", "smollm2")
    monkeypatch.setenv("FROTA_MAX_NUM_SEQS", "8")
    monkeypatch.setenv("FROTA_PORT", "9000")
    monkeypatch.setenv("FROTA_KV_CACHE_MEMORY", "2GiB")
    monkeypatch.setenv("FROTA_ENABLE_PREFIX_CACHING", "false")
    args = parse(["--port", "9100"])
    assert args.model == "smollm2"
    assert args.max_num_seqs == 8
    assert args.port == 9100
    assert args.kv_cache_memory == 2 * 2**30
    assert engine_kwargs(args) == {"model": "smollm2", "max_num_seqs": 8,
                                   "kv_cache_memory": 2 * 2**30,
                                   "enable_prefix_caching": False}


def test_model_is_required_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FROTA_MODEL", raising=False)
    with pytest.raises(SystemExit):
        parse([])


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROTA_MAX_QUEUE", "lots")
    with pytest.raises(SystemExit, match="FROTA_MAX_QUEUE"):
        parse(["--model", "m"])


def test_env_names_follow_the_contract() -> None:
    assert env_name("--max-num-batched-tokens") == "FROTA_MAX_NUM_BATCHED_TOKENS"


@pytest.mark.parametrize(("text", "size"), [("1024", 1024), ("4G", 4 * 10**9),
                                            ("512MiB", 512 * 2**20), ("1.5GB", 15 * 10**8)])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_worker_help_does_not_import_torch() -> None:
    code = ("import sys; from frota.cli.main import main\n"
            "try: main(['worker', '--help'])\nexcept SystemExit: pass\n"
            "assert 'torch' not in sys.modules and 'frota.engine' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
