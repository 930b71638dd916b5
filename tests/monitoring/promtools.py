"""Where the tests find prometheus and promtool: e2e/cluster/prometheus.sh's cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
PROMETHEUS_VERSION = "v0.316.0"
CACHE = Path(os.environ.get("FROTA_E2E_CACHE", Path.home() / ".cache/frota-e2e"))
BIN = CACHE / "bin" / f"prometheus-{PROMETHEUS_VERSION}"
PROMTOOL = BIN / "promtool"
PROMETHEUS = BIN / "prometheus"
NO_PROMTOOL = "no cached prometheus binary (build it with e2e/cluster/prometheus.sh)"
needs_promtool = pytest.mark.skipif(not PROMTOOL.exists(), reason=NO_PROMTOOL)
