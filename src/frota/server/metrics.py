"""Prometheus metrics with the vLLM names (frota.api.contract.WorkerMetric), a registry per app.

Engine state (running, waiting, KV usage, prefix cache) is read from
`engine.stats()` at scrape time; latencies and token counts are recorded by
the server as requests progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frota.api.contract import WorkerMetric
from frota.engine.outputs import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket boundaries copied from vLLM so dashboards built for it read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class EngineStatsCollector(Collector):
    """Turns `engine.stats()` into gauges and counters on every scrape."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None]) -> None:
        self.model_name = model_name
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if s is None:  # still loading: nothing meaningful to report
            return
        labels = ["model_name"]
        values = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge(WorkerMetric.NUM_REQUESTS_RUNNING, "Requests in the running batch.",
                    s.num_running)
        yield gauge(WorkerMetric.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.",
                    s.num_waiting)
        total = max(s.num_kv_blocks_total, 1)
        yield gauge(WorkerMetric.KV_CACHE_USAGE_PERC, "KV-cache usage (1 means 100 percent).",
                    s.num_kv_blocks_used / total)
        yield counter(WorkerMetric.PREFIX_CACHE_QUERIES,
                      "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries)
        yield counter(WorkerMetric.PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.",
                      s.prefix_cache_hits)
        info = GaugeMetricFamily(WorkerMetric.CACHE_CONFIG_INFO,
                                 "Information of the KV cache config.",
                                 labels=["model_name", "block_size", "num_gpu_blocks"])
        info.add_metric([self.model_name, str(s.block_size), str(s.num_kv_blocks_total)], 1.0)
        yield info
        if s.max_adapters > 0:  # exported only with LoRA on, as vLLM does
            lora = GaugeMetricFamily(WorkerMetric.LORA_REQUESTS_INFO, "Running stats on lora requests.",
                                     labels=["running_lora_adapters", "max_lora",
                                             "waiting_lora_adapters"])
            lora.add_metric([",".join(s.running_adapters), str(s.max_adapters),
                             ",".join(s.waiting_adapters)], time.time())
            yield lora
        experts = getattr(s, "expert_tokens", None)
        if experts:  # MoE: a hot expert is the bottleneck of an expert-parallel group
            c = CounterMetricFamily("frota_expert_tokens", "Tokens routed to each expert "
                                    "(token, slot pairs), per MoE layer.",
                                    labels=["model_name", "layer", "expert"])
            for (layer, expert), n in sorted(experts.items()):
                c.add_metric([self.model_name, str(layer), str(expert)], n)
            yield c


class ServerMetrics:
    """The metrics one worker exports, in their own registry."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None]) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineStatsCollector(model_name, stats))
        labels = ["model_name"]
        self.ttft = Histogram(WorkerMetric.TIME_TO_FIRST_TOKEN_SECONDS, "Time to first token.",
                              labels, buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram(WorkerMetric.INTER_TOKEN_LATENCY_SECONDS,
                             "Time between output tokens.", labels, buckets=ITL_BUCKETS,
                             registry=self.registry)
        self.e2e = Histogram(WorkerMetric.E2E_REQUEST_LATENCY_SECONDS,
                             "Request latency end to end.", labels, buckets=E2E_BUCKETS,
                             registry=self.registry)
        self.prompt_tokens = Counter(WorkerMetric.PROMPT_TOKENS, "Prefill tokens processed.",
                                     labels, registry=self.registry)
        self.generation_tokens = Counter(WorkerMetric.GENERATION_TOKENS, "Generated tokens.",
                                         labels, registry=self.registry)
        self.request_success = Counter(WorkerMetric.REQUEST_SUCCESS, "Finished requests.",
                                       ["model_name", "finished_reason"], registry=self.registry)
        # Label children resolved once: `labels()` takes a lock on every call.
        self._ttft = self.ttft.labels(model_name)
        self._itl = self.itl.labels(model_name)
        self._e2e = self.e2e.labels(model_name)
        self._prompt_tokens = self.prompt_tokens.labels(model_name)
        self._generation_tokens = self.generation_tokens.labels(model_name)
        self.rejected = Counter("frota_worker_rejected_requests", "Requests refused before "
                                "reaching the engine, by HTTP status.", ["model_name", "status"],
                                registry=self.registry)

    def observe_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_tokens(self, seconds: float, num_tokens: int) -> None:
        """A delta of `num_tokens` tokens arrived `seconds` after the previous one."""
        if num_tokens <= 0:
            return
        per_token = seconds / num_tokens
        for _ in range(num_tokens):
            self._itl.observe(per_token)

    def observe_finished(self, seconds: float, prompt_tokens: int, generation_tokens: int,
                         finish_reason: str) -> None:
        self._e2e.observe(seconds)
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(generation_tokens)
        self.request_success.labels(self.model_name, finish_reason).inc()

    def observe_rejected(self, status: int) -> None:
        self.rejected.labels(self.model_name, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
