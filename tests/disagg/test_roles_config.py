"""How the router learns roles and thresholds, and how `frota up` passes them (no processes)."""

from __future__ import annotations

import argparse

import pytest

from frota.api.contract import FleetKey
from frota.api.fleet_key import write_key_file
from frota.router import cli
from frota.router.disagg import estimate_prompt_tokens


@pytest.fixture(autouse=True)
def fleet_key(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Disaggregation signs with the fleet key: every router here has one."""
    monkeypatch.setenv(FleetKey.FILE_ENV, str(write_key_file(tmp_path / "fleet.key")))


def _args(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> argparse.Namespace:
    for key in ("FROTA_DISAGG_MIN_PROMPT_TOKENS", "FROTA_MIN_PREFILL_TOKENS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_static_prefill_workers_turn_disaggregation_on(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(monkeypatch, "--decode-workers", "d:1", "--prefill-workers", "p:1")
    config = cli.config_from_args(args)
    assert config.disagg is not None and config.disagg.config.min_prompt_tokens == 256
    assert config.disagg.discovery.urls == ["http://p:1"]
    assert cli._discovery(args).urls == ["http://d:1"]
    assert cli.config_from_args(_args(monkeypatch, "--workers", "w:1")).disagg is None


def test_disaggregation_without_the_fleet_key_is_refused_naming_the_flag(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FleetKey.FILE_ENV)
    args = _args(monkeypatch, "--decode-workers", "d:1", "--prefill-workers", "p:1")
    with pytest.raises(ValueError, match="--fleet-key-file"):
        cli.config_from_args(args)


@pytest.mark.parametrize("env", ["FROTA_MIN_PREFILL_TOKENS", "FROTA_DISAGG_MIN_PROMPT_TOKENS"])
def test_the_planners_threshold_env_maps_to_the_flag(monkeypatch: pytest.MonkeyPatch,
                                                     env: str) -> None:
    args = _args(monkeypatch, "--workers", "w:1", "--prefill-workers", "p:1", **{env: "77"})
    assert cli.config_from_args(args).disagg.config.min_prompt_tokens == 77
    flag = _args(monkeypatch, "--prefill-workers", "p:1", "--workers", "w:1",
                 "--disagg-min-prompt-tokens", "5", **{env: "77"})
    assert cli.config_from_args(flag).disagg.config.min_prompt_tokens == 5


def test_kubernetes_pools_split_by_the_role_label(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("frota.router.discovery.KubeApi.in_cluster",
                        classmethod(lambda cls: cls("https://k")))
    args = _args(monkeypatch, "--discovery", "kubernetes", "--namespace", "ns",
                 "--selector", "app.kubernetes.io/instance=x", FROTA_MIN_PREFILL_TOKENS="0")
    assert cli._discovery(args).selector == ("app.kubernetes.io/instance=x,"
                                             "frota.dev/role in (worker,decode)")
    disagg = cli.config_from_args(args).disagg
    assert disagg.discovery.selector == "app.kubernetes.io/instance=x,frota.dev/role=prefill"
    plain = _args(monkeypatch, "--discovery", "kubernetes", "--namespace", "ns",
                  "--selector", "a=b")
    assert cli._discovery(plain).selector == "a=b" and cli.config_from_args(plain).disagg is None


def test_prompt_estimate_is_characters_over_four_and_skips_what_cannot_split() -> None:
    assert estimate_prompt_tokens("/v1/completions", {"prompt": "x" * 400}) == 100
    assert estimate_prompt_tokens("/v1/completions", {"prompt": [1, 2, 3]}) == 3
    assert estimate_prompt_tokens("/v1/completions", {"prompt": ["a", "b"]}) is None
    assert estimate_prompt_tokens("/v1/completions", {"prompt": "x", "n": 2}) is None
    assert estimate_prompt_tokens("/v1/completions", {"prompt": "x", "logprobs": 1}) is None
    chat = {"messages": [{"role": "user", "content": "y" * 80}]}
    assert estimate_prompt_tokens("/v1/chat/completions", chat) == 20
    assert estimate_prompt_tokens("/v1/chat/completions", {**chat, "logprobs": True}) is None


def test_frota_up_passes_workers_by_role() -> None:
    from pathlib import Path

    from frota.local import topology
    from frota.local.fleet import FleetOptions, build
    from tests.disagg.fleet import free_port

    sample = Path(__file__).resolve().parents[2] / "manifests/samples/disaggregated.yaml"
    topo = topology.plan(topology.load(str(sample)))
    local = build(topo, FleetOptions(port=free_port()))
    argv = local.router.processes[0].argv
    leaders = {g.processes[0].role: [] for g in local.worker_groups}
    for g in local.worker_groups:
        leaders[g.processes[0].role].append(f"http://127.0.0.1:{g.processes[0].port}")
    assert argv[argv.index("--prefill-workers") + 1].split(",") == leaders["prefill"]
    assert argv[argv.index("--decode-workers") + 1].split(",") == leaders["decode"]
    assert "--workers" not in argv
