"""manifests/monitoring/scrape.py, loaded by path (manifests/ is no package)."""

from __future__ import annotations

import importlib.util
from typing import Any

from tests.monitoring.promtools import MONITORING

_spec = importlib.util.spec_from_file_location("frota_monitoring_scrape", MONITORING / "scrape.py")
assert _spec is not None and _spec.loader is not None
_scrape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scrape)


def scrape_configs(**interval: str) -> list[dict[str, Any]]:
    return _scrape.scrape_configs(**interval)
