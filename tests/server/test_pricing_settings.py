"""The pricing rule the server's settings give every batch (docs/SPEC.md section 5)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inference_auctions.server.auction.charges import PricingRule
from inference_auctions.server.settings import ServerSettings


def test_the_slots_default_to_the_batch_size_and_hold_a_whole_batch() -> None:
    assert ServerSettings(batch_size=32).auction_rule() == PricingRule(slots=32, rolling=True)
    assert ServerSettings(batch_size=32, priority_slots=100).auction_rule() == PricingRule(
        slots=100, rolling=True
    )
    assert ServerSettings(scheduling="batches").auction_rule() == PricingRule(slots=64)
    # The paper's rule prices whole batches: it brings them back, and refuses the rolling pool.
    paper = ServerSettings(pricing_rule="batch-size")
    assert (paper.auction_rule(), paper.scheduling) == (PricingRule(), "batches")
    with pytest.raises(ValidationError, match="pricing_rule batch-size prices a batch"):
        ServerSettings(pricing_rule="batch-size", scheduling="rolling")
    with pytest.raises(ValidationError, match=r"priority_slots \(16\) must be at least batch_size"):
        ServerSettings(batch_size=32, priority_slots=16)


def test_the_rule_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCE_AUCTION_PRIORITY_SLOTS", "128")
    monkeypatch.setenv("INFERENCE_AUCTION_BATCH_SIZE", "64")
    assert ServerSettings().auction_rule() == PricingRule(slots=128, rolling=True)
    monkeypatch.setenv("INFERENCE_AUCTION_PRICING_RULE", "cheap")
    with pytest.raises(ValidationError, match="pricing_rule"):
        ServerSettings()
