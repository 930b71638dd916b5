"""The worker exports every metric family the contract names for other parts to read."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from frota.api.contract import WorkerMetric
from frota.engine import EngineStats
from frota.server.metrics import ServerMetrics


def test_every_worker_metric_of_the_contract_is_exported() -> None:
    # a LoRA worker: vllm:lora_requests_info is exported only with adapter slots
    metrics = ServerMetrics("m", lambda: EngineStats(1, 2, 64, 8, 16, 10, 4, max_adapters=2))
    metrics.observe_first_token(0.1)
    metrics.observe_finished(0.5, 3, 5, "stop")
    families = {f.name for f in text_string_to_metric_families(metrics.render().decode())}
    names = {v for k, v in vars(WorkerMetric).items() if k.isupper()}
    # the parser names counter families without their `_total` sample suffix, as the contract does
    assert names <= families, names - families
