"""The figures of the pacing endpoints: the price table."""

from __future__ import annotations

from datetime import UTC, datetime

from inference_auctions.billing.market import ClearingSample
from inference_auctions.server.api.pacing_routes import prices_json

T = datetime(2030, 3, 1, tzinfo=UTC)


def _sample(
    batch: str, requests: int, priority: float, charge: int, user: int = 0, size: int = 4
) -> ClearingSample:
    return ClearingSample(batch, T, size, requests, priority, charge, user_id=user)


def test_price_table_per_unit_of_priority_and_per_band() -> None:
    samples = [
        _sample("b1", 1, 1.0, 300, user=1),  # top band, alone: 300 per unit
        _sample("b1", 1, 2 / 3, 100, user=2),  # second band: 150 per unit
        _sample("b1", 1, 0.0, 0, user=3),  # last place: no priority, no price
        _sample("b2", 2, 1.5, 600, user=1),  # two requests of one user: 400 per unit, no band
        _sample("b2", 1, 0.8, 200, user=2),  # top band: 250 per unit
        _sample("b3", 1, 1.0, 0, user=4, size=1),  # alone in its batch: no place, no band
    ]
    table = prices_json(samples, T, T)
    assert (table["batches"], table["samples"]) == (3, 5)
    per_unit = table["charge_per_priority_micros"]
    # Charge-weighted: (300 + 100 + 600 + 200 + 0) / (1 + 2/3 + 1.5 + 0.8 + 1).
    assert per_unit["mean"] == round(1200 / (1 + 2 / 3 + 1.5 + 0.8 + 1))
    assert per_unit["p50"] == 250  # the median of 0, 150, 250, 300, 400
    top, second, third, last = table["by_priority"]
    # Fewer than three users behind a band: its figures are not published.
    assert (top["samples"], top["median_charge_micros"]) == (2, None)
    assert (second["samples"], second["median_charge_micros"]) == (1, None)
    assert third["samples"] == 0 and third["median_charge_micros"] is None
    assert (last["samples"], last["median_charge_micros"]) == (1, None)


def test_a_band_is_published_from_three_users_and_lone_batches_never_count() -> None:
    samples = [_sample(f"b{i}", 1, 1.0, 100 * (i + 1), user=i) for i in range(3)]
    samples += [_sample(f"lone{i}", 1, 1.0, 0, user=9, size=1) for i in range(10)]
    top = prices_json(samples, T, T)["by_priority"][0]
    assert (top["samples"], top["median_charge_micros"]) == (3, 200)
    one_batch = [_sample("b", 1, 1.0 - i / 2, 50, user=i) for i in range(2)]
    table = prices_json(one_batch, T, T)  # one batch of two users: nothing published
    assert table["charge_per_priority_micros"]["p50"] is None
    assert table["charge_per_priority_micros"]["mean"] is None


def test_an_empty_window_has_no_prices() -> None:
    table = prices_json([], T, T)
    assert table["samples"] == 0 and table["charge_per_priority_micros"]["mean"] is None
