"""The one source of Frota's alert rules: writes rules/frota.rules.yaml (a plain Prometheus
rule file) and prometheus-rules.yaml (the same groups in a PrometheusRule, for the Prometheus
Operator). Thresholds are parameters with defaults:

    python manifests/monitoring/rules.py                        # rewrite both files
    python manifests/monitoring/rules.py --ttft-slo-seconds 1.5 --out /tmp/rules

The labels the expressions group by come from the scrape (scrape.yaml's PodMonitor and
ServiceMonitor): `namespace`, `pod`, `inferenceservice` (app.kubernetes.io/instance) and
`role` (frota.dev/role). The operator's own series carry the fleet's `namespace` and `name`
(its ServiceMonitor honours them). tests/monitoring/ checks and unit-tests the rules with
promtool; e2e/test_monitoring.py evaluates every expression against a fleet on kind.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
FLEET = "namespace, inferenceservice"


@dataclass(frozen=True)
class Thresholds:
    """What the alerts compare against; each is a flag of this script."""

    ttft_slo_seconds: float = 2.0  # p99 time to first token through the router
    rejected_ratio: float = 0.05  # share of the router's answers that are 429
    kv_cache_full_ratio: float = 0.95  # vllm:kv_cache_usage_perc is 0..1
    queue_wait_seconds: float = 10.0  # p99 wait for admission at the router
    not_ready_for: str = "10m"
    cold_start_for: str = "5m"  # requests held that long: no replica became ready
    # Where each alert's runbook_url points (+ "#anchor"): the repository's docs, relative
    # until a deployment sets where its copy of docs/operations.md is served.
    runbook_base: str = "docs/operations.md"


def alerts(t: Thresholds) -> list[dict[str, Any]]:
    """One alert per failure an operator of a fleet is paged or warned for."""
    def alert(name: str, expr: str, for_: str, severity: str, summary: str,
              description: str, anchor: str) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
                "annotations": {"summary": summary, "description": description,
                                "runbook_url": f"{t.runbook_base}#{anchor}"}}

    def p99(histogram: str) -> str:
        return (f"histogram_quantile(0.99, sum by ({FLEET}, le) "
                f"(rate({histogram}_bucket[5m])))")

    return [
        alert("FrotaFleetNotReady", "frota_operator_inferenceservice_ready == 0",
              t.not_ready_for, "critical",
              "InferenceService {{ $labels.namespace }}/{{ $labels.name }} is not Ready",
              f"Its Ready condition has been False for {t.not_ready_for}: fewer replicas "
              "serve than wanted, or the router has none.", "frotafleetnotready"),
        alert("FrotaTimeToFirstTokenHigh",
              f"{p99('frota_router_time_to_first_token_seconds')} > {t.ttft_slo_seconds:g}",
              "10m", "warning",
              "p99 time to first token of {{ $labels.namespace }}/{{ $labels.inferenceservice }}"
              " is {{ $value | humanizeDuration }}",
              f"Above the {t.ttft_slo_seconds:g} s SLO for 10 minutes (streaming requests, "
              "measured at the router).", "frotatimetofirsttokenhigh"),
        alert("FrotaRouterRejecting",
              f'sum by ({FLEET}) (rate(frota_router_requests_total{{status="429"}}[5m]))'
              f" / sum by ({FLEET}) (rate(frota_router_requests_total[5m]))"
              f" > {t.rejected_ratio:g}", "5m", "warning",
              "The router of {{ $labels.namespace }}/{{ $labels.inferenceservice }} answers "
              "{{ $value | humanizePercentage }} of requests with 429",
              "Admission control refuses requests: the queue is full or waits time out. "
              "The fleet needs more replicas or a higher admission limit.",
              "frotarouterrejecting"),
        alert("FrotaKVCacheNearFull",
              f"max by ({FLEET}, pod) (vllm:kv_cache_usage_perc) > {t.kv_cache_full_ratio:g}",
              "10m", "warning",
              "KV cache of {{ $labels.namespace }}/{{ $labels.pod }} is "
              "{{ $value | humanizePercentage }} full",
              "A worker near a full KV cache preempts sequences and queues new ones; "
              "latency rises.", "frotakvcachenearfull"),
        alert("FrotaRequestsWaitingLong",
              f"{p99('frota_router_queue_wait_seconds')} > {t.queue_wait_seconds:g}", "5m",
              "warning",
              "Requests to {{ $labels.namespace }}/{{ $labels.inferenceservice }} wait "
              "{{ $value | humanizeDuration }} for admission (p99)",
              f"The router's admission queue holds requests longer than "
              f"{t.queue_wait_seconds:g} s.", "frotarequestswaitinglong"),
        alert("FrotaWorkerGroupRestarts",
              'increase(frota_operator_group_restarts_total{cause="failure"}[15m]) > 0', "0m",
              "warning", "The operator restarted replica groups after a rank failed",
              "{{ $value | humanize }} replica groups were restarted in 15 minutes because one "
              "of their worker pods died (a crash, an OOM kill, a lost node). See the "
              "GroupRestarted events.", "frotaworkergrouprestarts"),
        alert("FrotaReconcileErrors",
              'sum by (namespace, pod) (increase(frota_operator_reconciles_total{result="error"}'
              "[15m])) > 0", "5m", "warning",
              "The Frota operator's reconciles fail",
              "{{ $value | humanize }} reconciles failed in 15 minutes; the fleets they own "
              "are not converging.", "frotareconcileerrors"),
        alert("FrotaColdStartNotReady",
              f"max by ({FLEET}) (frota_router_held_requests) > 0", t.cold_start_for,
              "critical",
              "{{ $labels.namespace }}/{{ $labels.inferenceservice }} has held requests for "
              f"{t.cold_start_for} with no replica ready",
              "The router holds requests while no worker is ready (scale to zero); no "
              f"replica became ready in {t.cold_start_for}, and held requests get 503 once "
              "holdSeconds pass.", "frotacoldstartnotready"),
    ]


def rule_file(t: Thresholds) -> dict[str, Any]:
    return {"groups": [{"name": "frota", "rules": alerts(t)}]}


def prometheus_rule(t: Thresholds) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "frota", "labels": {"app.kubernetes.io/name": "frota",
                                                 "app.kubernetes.io/component": "monitoring"}},
        "spec": rule_file(t),
    }


def dump(obj: dict[str, Any]) -> str:
    header = "# Generated by manifests/monitoring/rules.py; edit that, then run it.\n"
    return header + yaml.safe_dump(obj, sort_keys=False, width=100)


def write(out: Path, t: Thresholds) -> None:
    (out / "rules").mkdir(parents=True, exist_ok=True)
    (out / "rules" / "frota.rules.yaml").write_text(dump(rule_file(t)))
    (out / "prometheus-rules.yaml").write_text(dump(prometheus_rule(t)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in asdict(Thresholds()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    parser.add_argument("--out", type=Path, default=HERE)
    args = vars(parser.parse_args())
    write(args.pop("out"), Thresholds(**args))


if __name__ == "__main__":
    main()
