package main

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

func operator() *dashboard.DashboardBuilder {
	const window = "[$__rate_interval]"
	return dashboard.NewDashboardBuilder("Frota / Operator").
		Uid("frota-operator").
		Description("The Frota operator: reconciles, their errors and latency, and the fleets it keeps.").
		Tags([]string{"frota", "operator"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone("browser").
		WithVariable(datasourceVariable()).
		WithRow(row("Reconciles")).
		WithPanel(panel("Reconciles", "Reconciles per second by result (converged, progressing, "+
			"invalid, retry, error).", "ops",
			q("sum by (result) (rate(frota_operator_reconciles_total"+window+"))", "{{result}}"))).
		WithPanel(panel("Reconcile errors", "Reconciles that failed (error) or hit a transient "+
			"API error and were retried (retry).", "ops",
			q(`sum by (result) (rate(frota_operator_reconciles_total{result=~"error|retry"}`+window+"))",
				"{{result}}"))).
		WithPanel(panel("Reconcile latency", "Wall time of one reconcile.", "s",
			q("histogram_quantile(0.5, sum by (le) (rate(frota_operator_reconcile_duration_seconds_bucket"+
				window+")))", "p50"),
			q("histogram_quantile(0.99, sum by (le) (rate(frota_operator_reconcile_duration_seconds_bucket"+
				window+")))", "p99"))).
		WithPanel(panel("Pending reconciles", "InferenceServices with a reconcile queued or running.",
			"short", q("sum(frota_operator_pending_reconciles)", "pending"))).
		WithRow(row("Fleets")).
		WithPanel(panel("Fleets Ready", "1 while an InferenceService's Ready condition is True.",
			"short", q("max by (namespace, name) (frota_operator_inferenceservice_ready)",
				"{{namespace}}/{{name}}"))).
		WithPanel(panel("Objects applied", "Child objects written with server-side apply, by kind.",
			"ops", q("sum by (kind) (rate(frota_operator_applied_objects_total"+window+"))", "{{kind}}"))).
		WithPanel(panel("Group restarts", "Replica groups restarted together, by cause (rollout, "+
			"failure: a rank died).", "short",
			q("sum by (cause) (increase(frota_operator_group_restarts_total"+window+"))", "{{cause}}")))
}
