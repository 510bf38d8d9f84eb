"""The emulated engine's Prometheus metrics, named like SGLang's `sglang:*` series.

Counters and gauges are read from the simulator when scraped (so they never drift from it);
the latency histograms are observed when a request finishes. Each engine has its own registry,
so several emulators in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inference_auctions.server.emulator.simulator import EngineSimulator, RequestOutcome

__all__ = ["EmulatorMetrics"]

_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class _SimulatorCollector(Collector):
    """Counters and gauges taken from the simulator at scrape time."""

    def __init__(self, simulator: EngineSimulator, model_name: str) -> None:
        self._simulator = simulator
        self._labels = [model_name]

    def collect(self) -> Iterator[Metric]:
        simulator, stats = self._simulator, self._simulator.stats
        counters = (
            ("sglang:prompt_tokens", "Prompt tokens of admitted requests.", stats.prompt_tokens),
            ("sglang:generation_tokens", "Generated tokens.", stats.generation_tokens),
            ("sglang:cached_tokens", "Prompt tokens served from the cache.", stats.cached_tokens),
            ("sglang:num_requests", "Finished requests.", stats.finished_requests),
            (
                "sglang:evicted_tokens",
                "Tokens evicted from the cache.",
                simulator.cache.stats.evicted_tokens,
            ),
        )
        for name, documentation, value in counters:
            counter = CounterMetricFamily(name, documentation, labels=["model_name"])
            counter.add_metric(self._labels, value)
            yield counter
        capacity = simulator.cache.capacity
        gauges = (
            ("sglang:num_running_reqs", "Running requests.", simulator.num_running),
            ("sglang:num_queue_reqs", "Waiting requests.", simulator.num_waiting),
            (
                "sglang:token_usage",
                "Share of the KV pool in use.",
                simulator.used_tokens / capacity,
            ),
            (
                "sglang:cache_hit_rate",
                "Hit rate of the last prefill step.",
                stats.last_prefill_hit_rate,
            ),
        )
        for name, documentation, level in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
            gauge.add_metric(self._labels, level)
            yield gauge


class EmulatorMetrics:
    """The registry behind the emulator's `/metrics`."""

    def __init__(self, simulator: EngineSimulator, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self._model_name = model_name
        self._ttft = self._histogram("sglang:time_to_first_token_seconds", "Time to first token.")
        self._e2e = self._histogram("sglang:e2e_request_latency_seconds", "End-to-end latency.")
        self._queue = self._histogram("sglang:queue_time_seconds", "Time spent waiting.")
        self.registry.register(_SimulatorCollector(simulator, model_name))

    def observe(self, outcome: RequestOutcome) -> None:
        """Record the latencies of a request that finished."""
        for histogram, value in (
            (self._ttft, outcome.ttft),
            (self._e2e, outcome.e2e_latency),
            (self._queue, outcome.queue_time),
        ):
            if value is not None:
                histogram.labels(self._model_name).observe(value)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def _histogram(self, name: str, documentation: str) -> Histogram:
        return Histogram(
            name,
            documentation,
            labelnames=["model_name"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
