"""Prometheus metrics of the auction server, in a registry of the app's own."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Metrics:
    """The server's counters, gauges and histograms (names prefixed `inference_auction_`)."""

    def __init__(self, queue_length: Callable[[], int], inflight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The process's CPU, memory and file descriptors (`process_*`, Linux only) and the
        # Python it runs (`python_info`), as prometheus_client's default registry has them.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.queue_length = Gauge(
            "inference_auction_queue_length", "Requests waiting for a batch", registry=r
        )
        self.queue_length.set_function(queue_length)
        self.inflight = Gauge(
            "inference_auction_engine_inflight", "Requests outstanding at the engine", registry=r
        )
        self.inflight.set_function(inflight)
        self.batches = Counter("inference_auction_batches", "Batches cleared", registry=r)
        self.price_floor = Gauge(
            "inference_auction_price_floor_micros",
            "The posted price floor now (micro-credits; 0 under --price-floor off)",
            registry=r,
        )
        self.pricing_mode = Gauge(
            "inference_auction_pricing_mode",
            "1 for the pricing mode this server runs (auction, tiers or fcfs)",
            ["mode"],
            registry=r,
        )
        self.tier_requests = Counter(
            "inference_auction_tier_requests",
            "Requests cleared per tier (pricing tiers)",
            ["tier"],
            registry=r,
        )
        self.tier_revenue = Counter(
            "inference_auction_tier_revenue_micros",
            "Tier prices charged per tier, before refunds (pricing tiers; micro-credits)",
            ["tier"],
            registry=r,
        )
        self.ledger_group_writes = Histogram(
            "inference_auction_ledger_group_writes",
            "Holds and served records written per group commit (one transaction)",
            buckets=_SIZES,
            registry=r,
        )
        self.batch_size = Histogram(
            "inference_auction_batch_size", "Requests per batch", buckets=_SIZES, registry=r
        )
        self.auction_seconds = Histogram(
            "inference_auction_auction_seconds",
            "Time to clear a batch (tree, schedule, payments)",
            buckets=_SECONDS,
            registry=r,
        )
        self.settle_seconds = Histogram(
            "inference_auction_settle_seconds",
            "Time to settle a batch in the ledger",
            buckets=_SECONDS,
            registry=r,
        )
        self.revenue = Counter(
            "inference_auction_revenue_micros",
            "Charges settled: VCG charges, or tier prices under pricing tiers (micro-credits)",
            registry=r,
        )
        self.fee_revenue = Counter(
            "inference_auction_fee_revenue_micros",
            "Request fees settled, before any given back (micro-credits)",
            registry=r,
        )
        self.welfare = Counter(
            "inference_auction_welfare_micros",
            "Reported welfare of the chosen schedules (micro-credits)",
            registry=r,
        )
        self.dispatch_lag = Histogram(
            "inference_auction_dispatch_lag_seconds",
            "Arrival to dispatch at the engine",
            buckets=_SECONDS,
            registry=r,
        )
        self.overhead = Histogram(
            "inference_auction_overhead_seconds",
            "Arrival to dispatch minus the batching wait: the auction layer's own time",
            buckets=_SECONDS,
            registry=r,
        )
        self.engine_ttft = Histogram(
            "inference_auction_engine_ttft_seconds",
            "Dispatch to first token, as the engine reports it",
            buckets=_SECONDS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "inference_auction_prompt_tokens", "Prompt tokens served", registry=r
        )
        self.cached_tokens = Counter(
            "inference_auction_cached_tokens", "Prompt tokens the engine found cached", registry=r
        )
        self.cache_hit_rate = Gauge(
            "inference_auction_cache_hit_rate",
            "cached_tokens / prompt_tokens over the server's life",
            registry=r,
        )
        self.cache_hit_rate.set_function(self._hit_rate)
        self.ledger_errors = Counter(
            "inference_auction_ledger_errors",
            "Ledger operations that failed (database down or locked), by operation",
            ["operation"],
            registry=r,
        )
        self.requests = Counter(
            "inference_auction_requests", "Requests by outcome", ["status"], registry=r
        )
        # Every error answer the app's exception handlers render (`api.error_handlers`):
        # 402, 429 and the ledger's 503 never reach the engine, so `requests` misses them.
        self.refused = Counter(
            "inference_auction_refused_requests",
            "Requests answered with an error status before or instead of the engine's answer, "
            "by status and reason (the error's type)",
            ["status", "reason"],
            registry=r,
        )
        # Batches sent to the engine ahead of their settlement's commit
        # (server.serving.dispatch_ahead).
        self.batches_ahead = Counter(
            "inference_auction_batches_dispatched_ahead",
            "Batches sent to the engine while their settlement was still being committed",
            registry=r,
        )
        self.batches_voided = Counter(
            "inference_auction_batches_voided",
            "Batches sent ahead whose commit could not settle them whole: cancelled at the "
            "engine and cleared again",
            registry=r,
        )
        # Free requests that yielded the engine to paying ones (server.serving.dispatch).
        self.free_preempted = Counter(
            "inference_auction_free_preempted",
            "Free requests stopped at the engine for a paying one, to resume from where they were",
            registry=r,
        )
        # In-step prefix deferral (server.serving.deferral).
        self.deferral_held = Counter(
            "inference_auction_deferral_held",
            "Requests held back while an earlier one computed their shared prefix",
            registry=r,
        )
        self.deferral_hold_seconds = Histogram(
            "inference_auction_deferral_hold_seconds",
            "Time a held-back request waited before it was sent",
            buckets=_SECONDS,
            registry=r,
        )
        self.deferral_saved_tokens = Counter(
            "inference_auction_deferral_saved_tokens",
            "Prompt tokens a held-back request found computed when released",
            registry=r,
        )
        self.deferral_expired = Counter(
            "inference_auction_deferral_expired",
            "Holds that ran out before the request waited for produced its first token",
            registry=r,
        )

        self._prompt_total = 0
        self._cached_total = 0
        # The `requests` child of each outcome, made at its first use (as `labels` makes it,
        # so /metrics shows an outcome once it has happened): `labels` takes a lock and
        # builds its key on every call, several times the cost of the increment itself.
        self._outcomes: dict[str, Counter] = {}
        self._refusals: dict[tuple[int, str], Counter] = {}

    def count_request(self, status: str) -> None:
        """Count one request that ended with `status` (served, failed)."""
        counter = self._outcomes.get(status)
        if counter is None:
            counter = self._outcomes[status] = self.requests.labels(status=status)
        counter.inc()

    def count_refusal(self, status: int, reason: str) -> None:
        """Count one request answered with error `status` for `reason` (`insufficient_funds`,
        `rate_limited`, `unavailable`...)."""
        counter = self._refusals.get((status, reason))
        if counter is None:
            counter = self.refused.labels(status=str(status), reason=reason)
            self._refusals[(status, reason)] = counter
        counter.inc()

    def record_cache(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Count one served request's prompt and cached tokens."""
        self.prompt_tokens.inc(prompt_tokens)
        if cached_tokens:  # adding 0 would only take the counter's lock
            self.cached_tokens.inc(cached_tokens)
        self._prompt_total += prompt_tokens
        self._cached_total += cached_tokens

    def _hit_rate(self) -> float:
        return self._cached_total / self._prompt_total if self._prompt_total else 0.0

    def cache_hit_rate_value(self) -> float:
        """cached_tokens / prompt_tokens over the server's life (0 before any request)."""
        return self._hit_rate()

    def ledger_error_counts(self) -> dict[str, int]:
        """Failed ledger operations since start, by operation (those that never failed: 0)."""
        counts = dict.fromkeys(("hold", "release", "settle", "refund", "record"), 0)
        for family in self.ledger_errors.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["operation"]] = int(sample.value)
        return counts

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
