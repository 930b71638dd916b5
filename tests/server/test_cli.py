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


def test_the_lora_flags_the_operator_emits_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    from frota.api import LoRA
    from frota.plan.runtimes import lora_args
    from frota.server.cli import lora_options

    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    emitted = lora_args(LoRA(maxAdapters=3, maxRank=8), [("sql", "/a/sql"), ("chat", "/a/chat")])
    args = parse(["--model", "m", "--role", "both", *emitted, "--allow-runtime-lora",
                  "--max-num-seqs", "4"])
    assert engine_kwargs(args) == {"model": "m", "max_num_seqs": 4, "max_loras": 3,
                                   "max_lora_rank": 8}
    lora = lora_options(args)
    assert lora is not None and lora.runtime_loading
    assert list(lora.modules) == [("sql", "/a/sql"), ("chat", "/a/chat")]


def test_lora_defaults_vllms_json_modules_and_its_runtime_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from frota.server.cli import lora_options

    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    args = parse(["--model", "m", "--enable-lora", "--lora-modules",
                  '{"name": "sql", "path": "/a/sql", "base_model_name": "m"}', "b=/a/b"])
    assert engine_kwargs(args) == {"model": "m", "max_loras": 4, "max_lora_rank": 16}
    lora = lora_options(args)
    assert lora is not None and lora.runtime_loading
    assert list(lora.modules) == [("sql", "/a/sql"), ("b", "/a/b")]
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0")
    assert not lora_options(parse(["--model", "m", "--enable-lora"])).runtime_loading


def test_without_enable_lora_nothing_of_lora_reaches_the_engine_and_modules_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from frota.server.cli import lora_options

    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
    args = parse(["--model", "m"])
    assert engine_kwargs(args) == {"model": "m"} and lora_options(args) is None
    with pytest.raises(SystemExit, match="need --enable-lora"):
        lora_options(parse(["--model", "m", "--lora-modules", "a=/p"]))


@pytest.mark.parametrize("item", ["noequals", "=/p", "a=", '{"name": "a"}', "{broken"])
def test_a_malformed_lora_module_is_refused(item: str) -> None:
    with pytest.raises(SystemExit):
        parse(["--model", "m", "--enable-lora", "--lora-modules", item])
