"""Prometheus metrics (`GET /metrics`), named after vLLM's with the `ember:` prefix.

Engine state (running/waiting requests, KV usage, prefix-cache and preemption counters, token totals)
is read from the engine at scrape time by a collector; latencies are histograms the server observes
as outputs stream (`Generation` calls the hooks), and outcomes count by finish reason or HTTP status.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


class _EngineCollector:
    def __init__(self, service):
        self.service = service

    def collect(self):
        engine = self.service.engine
        label = ["model_name"]
        name = [self.service.model_name]
        snap = engine.snapshot() if engine is not None else None
        running = GaugeMetricFamily("ember:num_requests_running", "Requests in the running batch", labels=label)
        waiting = GaugeMetricFamily("ember:num_requests_waiting", "Requests waiting to be scheduled", labels=label)
        usage = GaugeMetricFamily("ember:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)", labels=label)
        running.add_metric(name, snap["running"] if snap else 0)
        waiting.add_metric(name, snap["waiting"] if snap else 0)
        total = snap["total_kv_blocks"] if snap else 0
        usage.add_metric(name, (1 - snap["free_kv_blocks"] / total) if total else 0.0)
        yield from (running, waiting, usage)
        kv = snap["kv"] if snap else None
        for metric, help_text, value in (
            ("ember:prefix_cache_queries", "Prompts looked up in the prefix cache", kv.prefix_queries if kv else 0),
            ("ember:prefix_cache_hits", "Prompts that reused at least one cached block", kv.prefix_hits if kv else 0),
            (
                "ember:prefix_cache_reused_tokens",
                "Prompt tokens served from the prefix cache",
                kv.reused_tokens if kv else 0,
            ),
            ("ember:prefix_cache_evictions", "Cached blocks evicted to make room", kv.evictions if kv else 0),
            ("ember:num_preemptions", "Requests preempted for lack of KV blocks", snap["preemptions"] if snap else 0),
            (
                "ember:prompt_tokens",
                "Prompt tokens of finished requests",
                engine.counters.prompt_tokens if engine else 0,
            ),
            (
                "ember:generation_tokens",
                "Generated tokens of finished requests",
                engine.counters.generation_tokens if engine else 0,
            ),
        ):
            family = CounterMetricFamily(metric, help_text, labels=label)
            family.add_metric(name, value)
            yield family
        yield from _host_tier_metrics(snap["host_tier"] if snap else None, name)
        yield from _speculation_metrics(engine.speculation_stats() if engine is not None else None, name)


def _host_tier_metrics(tier, name: list[str]):
    """The prefix cache's host tier (runtime/state/host_tier.py HostTierCounters); zero while the engine keeps
    none."""
    for metric, help_text, attribute in (
        (
            "ember:prefix_cache_host_bytes_used",
            "Host memory holding evicted KV blocks and recurrent-state snapshots (bytes)",
            "used_bytes",
        ),
        ("ember:prefix_cache_host_bytes_capacity", "Host memory the host tier may hold (bytes)", "capacity_bytes"),
        (
            "ember:prefix_cache_host_snapshot_bytes_used",
            "Host memory holding recurrent-state snapshots (bytes; part of bytes_used)",
            "snapshot_bytes",
        ),
    ):
        family = GaugeMetricFamily(metric, help_text, labels=["model_name"])
        family.add_metric(name, getattr(tier, attribute) if tier is not None else 0)
        yield family
    for metric, help_text, attribute in (
        (
            "ember:prefix_cache_host_offloaded_blocks",
            "KV blocks evicted from the device copied to host memory",
            "offloaded_blocks",
        ),
        ("ember:prefix_cache_host_restored_blocks", "KV blocks prefix hits copied back from host", "restored_blocks"),
        (
            "ember:prefix_cache_host_restored_tokens",
            "Prompt tokens served by blocks copied back from host memory",
            "restored_tokens",
        ),
        ("ember:prefix_cache_host_dropped_blocks", "Host KV blocks dropped to stay within capacity", "dropped_blocks"),
        (
            "ember:prefix_cache_host_offloaded_snapshots",
            "Recurrent-state snapshots evicted from the device copied to host memory",
            "offloaded_snapshots",
        ),
        (
            "ember:prefix_cache_host_restored_snapshots",
            "Recurrent-state snapshots prefix hits copied back from host memory",
            "restored_snapshots",
        ),
        (
            "ember:prefix_cache_host_dropped_snapshots",
            "Host recurrent-state snapshots dropped to stay within capacity",
            "dropped_snapshots",
        ),
        ("ember:prefix_cache_host_offloaded_bytes", "Bytes copied from the device to the host tier", "offloaded_bytes"),
        (
            "ember:prefix_cache_host_restored_bytes",
            "Bytes prefix hits copied back from the host tier",
            "restored_bytes",
        ),
    ):
        family = CounterMetricFamily(metric, help_text, labels=["model_name"])
        family.add_metric(name, getattr(tier, attribute) if tier is not None else 0)
        yield family


def _speculation_metrics(stats, name: list[str]):
    """vLLM's spec-decode counters (runtime/speculative/stats.py): drafts, draft tokens, accepted tokens, and
    accepted tokens per draft position; zero while the engine does not speculate."""
    for metric, help_text, attribute in (
        ("ember:spec_decode_num_drafts", "Verify steps of a row that drafted", "num_drafts"),
        ("ember:spec_decode_num_draft_tokens", "Draft tokens proposed", "num_draft_tokens"),
        ("ember:spec_decode_num_accepted_tokens", "Draft tokens accepted", "num_accepted_tokens"),
    ):
        family = CounterMetricFamily(metric, help_text, labels=["model_name"])
        family.add_metric(name, getattr(stats, attribute) if stats is not None else 0)
        yield family
    per_position = CounterMetricFamily(
        "ember:spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted at each draft position",
        labels=["model_name", "position"],
    )
    for position, count in enumerate(stats.accepted_per_position if stats is not None else ()):
        per_position.add_metric([*name, str(position)], count)
    yield per_position


class ServerMetrics:
    def __init__(self, service):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(service))
        self.ttft = Histogram(
            "ember:time_to_first_token_seconds",
            "Arrival to first token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "ember:inter_token_latency_seconds",
            "Time between streamed token outputs",
            buckets=_ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "ember:e2e_request_latency_seconds", "Arrival to finish", buckets=_LATENCY_BUCKETS, registry=self.registry
        )
        self.queue = Histogram(
            "ember:request_queue_time_seconds",
            "Arrival to first scheduled",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.outcomes = Counter(
            "ember:request_success",
            "Finished generations by finish reason",
            ["finished_reason"],
            registry=self.registry,
        )
        self.http = Counter(
            "ember:http_requests", "HTTP responses by route and status", ["route", "status"], registry=self.registry
        )
        self.started = Counter("ember:requests_started", "Generations submitted to the engine", registry=self.registry)

    def request_started(self) -> None:
        self.started.inc()

    def observe_inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def request_ended(self, reason: str, usage) -> None:
        self.outcomes.labels(reason).inc()
        if usage is not None:
            self.ttft.observe(usage.ttft_s)
            self.e2e.observe(usage.e2e_s)
            self.queue.observe(usage.queue_s)

    def http_response(self, route: str, status: int) -> None:
        self.http.labels(route, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
