"""`frota router`: flags, environment, start-up and shutdown as a real process."""

import argparse
import asyncio
import os
import signal
import subprocess
import sys

import aiohttp

from frota.router import cli
from frota.router.app import RouterConfig
from frota.router.policies import PolicyName, PrefixAwareConfig
from tests.processes import free_port


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_fall_back_to_frota_environment_variables(monkeypatch):
    monkeypatch.setenv("FROTA_MAX_INFLIGHT", "7")
    monkeypatch.setenv("FROTA_POLICY", "prefix-aware")
    monkeypatch.setenv("FROTA_WORKERS", "a:1,b:2")
    monkeypatch.setenv("FROTA_DRAIN_TIMEOUT", "45")
    args = parse(["--policy", "session"])
    assert args.max_inflight == 7 and args.workers == "a:1,b:2"
    assert args.policy == "session"  # the command line wins
    config = cli.config_from_args(args)
    assert config.policy is PolicyName.SESSION and config.max_inflight == 7
    assert config.drain_timeout == 45.0


def test_flag_defaults_are_the_router_config_defaults():
    defaults = PrefixAwareConfig()
    config = cli.config_from_args(parse(["--workers", "a:1"]))
    assert config.prefix == defaults == RouterConfig().prefix
    assert config.drain_timeout == RouterConfig().drain_timeout


def test_help_names_each_flags_environment_variable():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    assert "[env FROTA_MAX_INFLIGHT]" in helps["--max-inflight"]
    assert "[env FROTA_PROBE_TIMEOUT]" in helps["--probe-timeout"]  # a flag with no other help
    assert "FROTA_DISAGG_MIN_PROMPT_TOKENS, or FROTA_MIN_PREFILL_TOKENS" in helps[
        "--disagg-min-prompt-tokens"]


def test_the_older_min_prefill_tokens_variable_applies_only_when_the_flags_own_is_unset(
        monkeypatch):
    monkeypatch.delenv("FROTA_DISAGG_MIN_PROMPT_TOKENS", raising=False)
    monkeypatch.setenv("FROTA_MIN_PREFILL_TOKENS", "100")
    assert parse([]).disagg_min_prompt_tokens == 100
    monkeypatch.setenv("FROTA_DISAGG_MIN_PROMPT_TOKENS", "50")
    assert parse([]).disagg_min_prompt_tokens == 50
    assert parse(["--disagg-min-prompt-tokens", "10"]).disagg_min_prompt_tokens == 10


def test_router_modules_never_import_torch_or_the_engine():
    code = ("import sys, frota.router.cli, frota.router.app, frota.router.discovery, "
            "frota.router.policies; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('frota.engine')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


async def test_frota_router_serves_and_stops_on_sigterm(start_worker):
    worker = await start_worker(name="w")
    port = free_port()
    env = {**os.environ, "FROTA_POLICY": "least-load"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "frota.cli.main", "router", "--workers", worker.url,
        "--host", "127.0.0.1", "--port", str(port), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):  # start-up: wait on readiness, at most ~15 s
                try:
                    async with session.get(f"http://127.0.0.1:{port}/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("frota router never became ready")
            async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                    json={"prompt": "x"}) as r:
                assert r.status == 200 and (await r.json())["worker"] == "w"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        output = (await proc.stdout.read()).decode()
        assert "listening on" in output and "least-load" in output
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_missing_workers_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "frota.cli.main", "router"],
                         capture_output=True, text=True, env={**os.environ, "FROTA_WORKERS": ""})
    assert out.returncode != 0 and "--workers" in out.stderr


def test_a_bad_option_value_is_one_line_naming_the_flag():
    for flags, named in ((["--policy", "prefix-aware", "--prefix-balance", "-1"],
                          "--prefix-balance"),
                         (["--policy", "prefix-aware", "--prefix-balance-abs", "-1"],
                          "--prefix-balance-abs"),
                         (["--policy", "prefix-aware", "--prefix-hot-window", "-1"],
                          "--prefix-hot-window"),
                         (["--api-key-file", "/nonexistent/keys"], "/nonexistent/keys")):
        out = subprocess.run([sys.executable, "-m", "frota.cli.main", "router",
                              "--workers", "http://127.0.0.1:9", "--port", "0", *flags],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2
        assert out.stderr.startswith("frota router: error:") and named in out.stderr
        assert "Traceback" not in out.stderr
