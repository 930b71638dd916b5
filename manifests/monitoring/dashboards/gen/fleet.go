package main

import (
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// sel is a selector of one fleet's series: the namespace and instance variables.
func sel(metric string, matchers ...string) string {
	all := append([]string{`namespace=~"$namespace"`, `inferenceservice=~"$instance"`}, matchers...)
	return metric + "{" + strings.Join(all, ", ") + "}"
}

func rate(metric string, matchers ...string) string {
	return "rate(" + sel(metric, matchers...) + "[$__rate_interval])"
}

func quantile(q, histogram, by string) string {
	group := "le"
	if by != "" {
		group = by + ", le"
	}
	return "histogram_quantile(" + q + ", sum by (" + group + ") (" + rate(histogram+"_bucket") + "))"
}

func fleet() *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder("Frota / Fleet").
		Uid("frota-fleet").
		Description("One or more InferenceServices: traffic, latency, engine state and capacity.").
		Tags([]string{"frota", "llm-inference"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone("browser").
		WithVariable(datasourceVariable()).
		WithVariable(labelVariable("namespace", "namespace", "Namespace", "frota_router_requests_total")).
		WithVariable(labelVariable("instance", "inferenceservice", "InferenceService",
			`frota_router_requests_total{namespace=~"$namespace"}`)).
		WithRow(row("Traffic")).
		WithPanel(panel("Requests", "Requests the router answered, by HTTP status.", "reqps",
			q("sum by (status) ("+rate("frota_router_requests_total")+")", "{{status}}"))).
		WithPanel(panel("Errors", "Answers that were not 2xx, by status, and streams that "+
			"failed after their first byte.", "reqps",
			q(`sum by (status) (`+rate("frota_router_requests_total", `status!~"2.."`)+")", "{{status}}"),
			q("sum("+rate("frota_router_stream_errors_total")+")", "stream errors"))).
		WithPanel(panel("Rejected (429)", "Requests admission control refused, by reason "+
			"(queue_full, queue_timeout).", "reqps",
			q("sum by (reason) ("+rate("frota_router_rejections_total")+")", "{{reason}}"))).
		WithPanel(panel("Tokens", "Prompt tokens prefilled and tokens generated per second, "+
			"over every worker.", "short",
			q("sum("+rate("vllm:prompt_tokens_total")+")", "prompt"),
			q("sum("+rate("vllm:generation_tokens_total")+")", "generated"))).
		WithRow(row("Latency")).
		WithPanel(panel("Time to first token", "Streaming requests, from the router's receipt "+
			"to its first forwarded chunk.", "s",
			q(quantile("0.5", "frota_router_time_to_first_token_seconds", ""), "p50"),
			q(quantile("0.99", "frota_router_time_to_first_token_seconds", ""), "p99"))).
		WithPanel(panel("Inter-token latency", "Time between consecutive chunks the router "+
			"forwards.", "s",
			q(quantile("0.5", "frota_router_inter_token_latency_seconds", ""), "p50"),
			q(quantile("0.99", "frota_router_inter_token_latency_seconds", ""), "p99"))).
		WithPanel(panel("Request latency", "Receipt to last byte at the router, by endpoint.", "s",
			q(quantile("0.5", "frota_router_e2e_request_latency_seconds", "endpoint"), "p50 {{endpoint}}"),
			q(quantile("0.99", "frota_router_e2e_request_latency_seconds", "endpoint"), "p99 {{endpoint}}"))).
		WithPanel(panel("Admission wait", "Time requests waited for admission at the router "+
			"(only requests that waited).", "s",
			q(quantile("0.99", "frota_router_queue_wait_seconds", ""), "p99"))).
		WithRow(row("Engine")).
		WithPanel(panel("KV cache use", "Share of each worker's KV cache blocks in use.",
			"percentunit", q("max by (pod) ("+sel("vllm:kv_cache_usage_perc")+")", "{{pod}}"))).
		WithPanel(panel("Queue", "Requests waiting for admission at the routers, and waiting "+
			"or running in each engine.", "short",
			q("sum("+sel("frota_router_queue_depth")+")", "router queue"),
			q("sum by (pod) ("+sel("vllm:num_requests_waiting")+")", "waiting {{pod}}"),
			q("sum by (pod) ("+sel("vllm:num_requests_running")+")", "running {{pod}}"))).
		WithPanel(panel("Prefix cache hit rate", "Prompt tokens found in the prefix cache over "+
			"those looked up.", "percentunit",
			q("sum("+rate("vllm:prefix_cache_hits_total")+") / sum("+
				rate("vllm:prefix_cache_queries_total")+")", "hit rate"))).
		WithPanel(panel("Replicas per role", "Serving pods scraped per role (rank 0 of each "+
			"worker group, and the routers).", "short",
			q("count by (role) ("+sel("up")+" == 1)", "{{role}}"))).
		WithRow(row("Disaggregated prefill/decode")).
		WithPanel(panel("P/D split", "How requests were served when the fleet is disaggregated: "+
			"through prefill then decode, or colocated.", "reqps",
			q("sum by (route) ("+rate("frota_router_disagg_requests_total")+")", "{{route}}"))).
		WithPanel(panel("Prefill and KV handoff", "Prefill stage (request to KV handle) and "+
			"the decode stage until its headers (the KV transfer).", "s",
			q(quantile("0.99", "frota_router_prefill_latency_seconds", ""), "prefill p99"),
			q(quantile("0.99", "frota_router_kv_handoff_seconds", ""), "handoff p99")))
}
