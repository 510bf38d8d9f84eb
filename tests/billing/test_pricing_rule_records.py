"""The pricing rule recorded with each batch, and crash recovery pricing a batch by its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from inference_auctions.billing import Ledger
from inference_auctions.billing.errors import InvalidBatch
from inference_auctions.billing.inputs import BatchInput, RequestInput
from inference_auctions.billing.models import AuctionBatch
from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.auction.charges import PricingRule, Repricer
from inference_auctions.server.serving.clearing import refund_rule, settled_repricer

# alice's two requests share a prefix with bob's: her failed one changes her charge.
REQUESTS = [
    ("alice", [1, 2], 900_000),
    ("bob", [1, 3], 700_000),
    ("alice", [4], 500_000),
    ("carol", [5], 300_000),
]


def _settle(ledger: Ledger, batch_id: str, rule: PricingRule) -> tuple[Repricer, dict[str, int]]:
    """Clear the batch under `rule` and settle it as the server does; return its repricer."""
    batch = [
        AuctionRequest(f"{batch_id}-r{k}", user, tokens, bid)
        for k, (user, tokens, bid) in enumerate(REQUESTS)
    ]
    for request in batch:
        ledger.place_hold(request.user, request.rid, request.bid)
    outcome = run_auction(batch, rule)
    repricer = Repricer.from_outcome(outcome)
    paths = repricer.tree_paths()
    record = BatchInput(
        batch_id=batch_id,
        closed_at=datetime(2026, 12, 3, 12, 0, tzinfo=UTC),
        n=outcome.size,
        revenue_micros=outcome.revenue,
        welfare_micros=int(outcome.welfare),
        pricing_rule=rule.name,
        priority_slots=rule.slots,
    )
    requests = [
        RequestInput(
            rid=r.rid,
            user=r.user,
            position=outcome.positions[r.rid],
            priority=float(outcome.priority(r.rid)),
            bid_micros=r.bid,
            prompt_tokens=len(r.tokens),
            arrival=k,
            tree_path=paths[r.rid],
        )
        for k, r in enumerate(batch)
    ]
    ledger.settle_batch(record, requests, outcome.payments)
    return repricer, outcome.payments


@pytest.fixture
def users(ledger: Ledger) -> Ledger:
    for name in ("alice", "bob", "carol"):
        ledger.create_user(name, budget_micros=10_000_000)
    return ledger


def test_each_batch_keeps_its_rule_and_recovery_refunds_by_it(users: Ledger) -> None:
    ledger = users
    old, old_charges = _settle(ledger, "before", PricingRule())
    new, new_charges = _settle(ledger, "after", PricingRule(slots=16))
    assert old_charges["alice"] != new_charges["alice"]  # the rules price alice differently
    with ledger.engine.connect() as connection:
        rows = connection.execute(
            select(AuctionBatch.id, AuctionBatch.pricing_rule, AuctionBatch.priority_slots)
        ).all()
    assert sorted(tuple(row) for row in rows) == [
        ("after", "fixed-slots", 16),
        ("before", "batch-size", None),
    ]

    # alice's first request of each batch was answered; her second (and everyone else's) not.
    ledger.record_served("before-r0")
    ledger.record_served("after-r0")
    refunds = ledger.refund_unserved(timedelta(0), rule=refund_rule)
    got = {(r.batch_id, r.user): r.amount_micros for r in refunds}
    for batch_id, repricer, charges in (("before", old, old_charges), ("after", new, new_charges)):
        expected = repricer.failure_refund("alice", {f"{batch_id}-r2"}, charges["alice"])
        assert got.get((batch_id, "alice"), 0) == expected
        assert got.get((batch_id, "bob"), 0) == charges["bob"]
    assert ledger.reconcile().ok


def test_the_dashboard_splits_a_charge_under_the_batchs_own_rule(users: Ledger) -> None:
    """Each request's share of alice's charge is priced under the slots its batch recorded."""
    ledger = users
    _, old_charges = _settle(ledger, "before", PricingRule())
    new, new_charges = _settle(ledger, "after", PricingRule(slots=16))
    shared = ledger.account_activity("alice").shared_batches
    assert [p.priority_slots for p in shared["after"]] == [16] * len(REQUESTS)
    assert [p.priority_slots for p in shared["before"]] == [None] * len(REQUESTS)
    for batch_id, charges in (("before", old_charges), ("after", new_charges)):
        repricer = settled_repricer(shared[batch_id])
        assert repricer.charge("alice") == charges["alice"]  # the charge the batch made
    assert settled_repricer(shared["after"]).charge("alice") == new.charge("alice")


def test_a_rule_that_does_not_fit_the_batch_is_refused_by_name(users: Ledger) -> None:
    ledger = users
    ledger.place_hold("alice", "x1", 100)
    record = BatchInput(
        batch_id="bad",
        closed_at=datetime(2026, 12, 3, 12, 0, tzinfo=UTC),
        n=1,
        revenue_micros=0,
        welfare_micros=0,
        pricing_rule="fixed-slots",
        priority_slots=None,
    )
    request = RequestInput(
        rid="x1", user="alice", position=0, priority=1.0, bid_micros=100, prompt_tokens=1
    )
    with pytest.raises(InvalidBatch, match="priority_slots must be an integer >= n"):
        ledger.settle_batch(record, [request], {})
    with pytest.raises(InvalidBatch, match="pricing_rule must be 'batch-size', 'fixed-slots'"):
        ledger.settle_batch(
            BatchInput(**{**_fields(record), "pricing_rule": "cheap"}), [request], {}
        )


def _fields(record: BatchInput) -> dict[str, object]:
    return {name: getattr(record, name) for name in BatchInput.__dataclass_fields__}


def test_low_bids_under_other_users_prefixes_are_flagged(users: Ledger) -> None:
    ledger = users
    for name in ("mallory", "zed"):
        ledger.create_user(name, budget_micros=1_000_000)
    batch = [
        AuctionRequest("b1", "bob", [1, 3, 5], 700_000),
        AuctionRequest("m1", "mallory", [1, 3, 9], 0),  # under bob's prefix [1, 3]
        AuctionRequest("m2", "mallory", [1, 8], 1),  # under [1]: bob's too
        AuctionRequest("m3", "mallory", [6], 0),  # a fresh prompt: under nobody's
        AuctionRequest("z1", "zed", [4, 4], 0),  # a fresh prompt
        AuctionRequest("c1", "carol", [1, 3, 7], 500),  # bids low, under bob's prefix
        AuctionRequest("a1", "alice", [1, 3, 5, 2], 900_000),  # a high bid: never flagged
    ]
    for request in batch:
        ledger.place_hold(request.user, request.rid, request.bid)
    outcome = run_auction(batch, PricingRule(slots=8))
    paths = Repricer.from_outcome(outcome).tree_paths()
    record = BatchInput(
        batch_id="watched",
        closed_at=datetime.now(UTC),
        n=outcome.size,
        revenue_micros=outcome.revenue,
        welfare_micros=int(outcome.welfare),
        pricing_rule="fixed-slots",
        priority_slots=8,
    )
    requests = [
        RequestInput(
            rid=r.rid,
            user=r.user,
            position=outcome.positions[r.rid],
            priority=float(outcome.priority(r.rid)),
            bid_micros=r.bid,
            prompt_tokens=len(r.tokens),
            arrival=k,
            tree_path=paths[r.rid],
        )
        for k, r in enumerate(batch)
    ]
    ledger.settle_batch(record, requests, outcome.payments)
    flagged = ledger.prefix_squatters(timedelta(hours=1), low_bid_micros=1_000)
    assert [
        (s.user, s.under_others, s.low_bid_requests, s.other_users, s.batches) for s in flagged
    ] == [
        ("mallory", 2, 3, 3, 1),  # bob, carol and alice share [1]
        ("carol", 1, 1, 3, 1),
    ]
    assert ledger.prefix_squatters(timedelta(hours=1), low_bid_micros=1_000, minimum=2) == [
        flagged[0]
    ]
