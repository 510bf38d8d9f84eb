"""The figures of the pacing endpoints: the price table."""

from __future__ import annotations

from datetime import UTC, datetime

from inference_auctions.billing.market import ClearingSample
from inference_auctions.server.api.pacing_routes import prices_json

T = datetime(2030, 3, 1, tzinfo=UTC)


def _sample(batch: str, requests: int, priority: float, charge: int) -> ClearingSample:
    return ClearingSample(batch, T, 4, requests, priority, charge)


def test_price_table_per_unit_of_priority_and_per_band() -> None:
    samples = [
        _sample("b1", 1, 1.0, 300),  # top band, alone: 300 per unit
        _sample("b1", 1, 2 / 3, 100),  # second band: 150 per unit
        _sample("b1", 1, 0.0, 0),  # last place: no priority, no price
        _sample("b2", 2, 1.5, 600),  # two requests of one user: 400 per unit, in no band
        _sample("b2", 1, 0.8, 200),  # top band: 250 per unit
    ]
    table = prices_json(samples, T, T)
    assert (table["batches"], table["samples"]) == (2, 4)
    per_unit = table["charge_per_priority_micros"]
    # Charge-weighted: (300 + 100 + 600 + 200) / (1 + 2/3 + 1.5 + 0.8).
    assert per_unit["mean"] == round(1200 / (1 + 2 / 3 + 1.5 + 0.8))
    assert per_unit["p50"] == 275  # the median of 150, 250, 300, 400
    top, second, third, last = table["by_priority"]
    assert (top["samples"], top["median_charge_micros"]) == (2, 250)
    assert (second["samples"], second["median_charge_micros"]) == (1, 100)
    assert third["samples"] == 0 and third["median_charge_micros"] is None
    assert (last["samples"], last["median_charge_micros"]) == (1, 0)


def test_an_empty_window_has_no_prices() -> None:
    table = prices_json([], T, T)
    assert table["samples"] == 0 and table["charge_per_priority_micros"]["mean"] is None
