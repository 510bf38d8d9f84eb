"""The server's metrics as /metrics shows them: an outcome appears once it has happened."""

from __future__ import annotations

from inference_auctions.server.metrics import Metrics


def _line(metrics: Metrics, prefix: str) -> list[str]:
    return [line for line in metrics.render().decode().splitlines() if line.startswith(prefix)]


def test_request_outcomes_are_counted_and_shown_only_once_they_happen() -> None:
    metrics = Metrics(queue_length=lambda: 0, inflight=lambda: 0)
    assert _line(metrics, "inference_auction_requests_total") == []
    metrics.count_request("served")
    metrics.count_request("served")
    assert _line(metrics, "inference_auction_requests_total") == [
        'inference_auction_requests_total{status="served"} 2.0'
    ]
    metrics.count_request("failed")
    assert 'inference_auction_requests_total{status="failed"} 1.0' in _line(
        metrics, "inference_auction_requests_total"
    )


def test_cache_counts_and_hit_rate() -> None:
    metrics = Metrics(queue_length=lambda: 0, inflight=lambda: 0)
    metrics.record_cache(10, 0)
    metrics.record_cache(30, 20)
    assert _line(metrics, "inference_auction_prompt_tokens_total") == [
        "inference_auction_prompt_tokens_total 40.0"
    ]
    assert _line(metrics, "inference_auction_cached_tokens_total") == [
        "inference_auction_cached_tokens_total 20.0"
    ]
    assert metrics.cache_hit_rate_value() == 0.5
