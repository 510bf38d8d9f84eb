"""Property tests of the failure refund and the per-request shares against the slow oracle."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.auction.reference import reference_failure_refund, reference_shares
from inference_auctions.server.auction.repricing import Repricer, largest_remainder
from tests.auction.strategies import batches, long_batches


@st.composite
def batch_and_failures(
    draw: st.DrawFn, max_size: int = 9
) -> tuple[list[AuctionRequest], str, set[str]]:
    """A non-empty batch, one of its users and a subset of that user's requests."""
    batch = draw(batches(max_size=max_size).filter(bool))
    user = draw(st.sampled_from(sorted({r.user for r in batch})))
    mine = [r.rid for r in batch if r.user == user]
    failed = set(draw(st.lists(st.sampled_from(mine), unique=True)))
    return batch, user, failed


@given(batch_and_failures())
def test_failure_refund_matches_the_oracle(
    case: tuple[list[AuctionRequest], str, set[str]],
) -> None:
    batch, user, failed = case
    charge = run_auction(batch).payments[user]
    refund = Repricer(batch).failure_refund(user, failed, charge)
    assert refund == reference_failure_refund(batch, user, failed)
    assert 0 <= refund <= charge


@given(batch_and_failures())
def test_failed_zero_bids_refund_nothing_and_all_failed_refund_all(
    case: tuple[list[AuctionRequest], str, set[str]],
) -> None:
    batch, user, failed = case
    charge = run_auction(batch).payments[user]
    repricer = Repricer(batch)
    zero_bids = {r.rid for r in batch if r.rid in failed and r.bid == 0}
    assert repricer.failure_refund(user, zero_bids, charge) == 0
    assert repricer.failure_refund(user, repricer.requests_of(user), charge) == charge
    assert repricer.failure_refund(user, (), charge) == 0


@given(batches(max_size=12).filter(bool))
def test_refunds_of_a_batch_never_exceed_its_charges(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    repricer = Repricer(batch)
    every_failure = sum(
        repricer.failure_refund(user, repricer.requests_of(user), charge)
        for user, charge in outcome.payments.items()
    )
    assert every_failure == outcome.revenue


@given(batch_and_failures())
def test_cumulative_refunds_reach_the_refund_of_all_failures(
    case: tuple[list[AuctionRequest], str, set[str]],
) -> None:
    # Failures arrive one at a time; each refunds the rule's value for all failed so far minus
    # what was already refunded (never negative), and the total is the rule's value for the set.
    batch, user, failed = case
    charge = run_auction(batch).payments[user]
    repricer = Repricer(batch)
    refunded = 0
    so_far: list[str] = []
    for rid in sorted(failed):
        so_far.append(rid)
        refunded += max(repricer.failure_refund(user, so_far, charge) - refunded, 0)
        assert refunded <= charge
    assert refunded >= repricer.failure_refund(user, failed, charge)


@given(batches(max_size=9).filter(bool))
def test_shares_match_the_oracle_and_sum_to_the_charge(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    repricer = Repricer(batch)
    for user, charge in outcome.payments.items():
        shares = repricer.shares(user, charge, outcome.positions)
        assert shares == reference_shares(batch, user)
        assert sum(shares.values()) == charge
        assert all(0 <= share <= charge for share in shares.values())


@given(long_batches(max_size=16).filter(bool))
def test_the_stored_tree_paths_price_the_batch_as_its_prompts_do(
    batch: list[AuctionRequest],
) -> None:
    outcome = run_auction(batch)
    paths = Repricer(batch).tree_paths()
    rebuilt = [AuctionRequest(r.rid, r.user, paths[r.rid], r.bid) for r in batch]
    assert run_auction(rebuilt).payments == outcome.payments
    assert run_auction(rebuilt).order == outcome.order
    repricer, again = Repricer(batch), Repricer(rebuilt)
    for user in outcome.payments:
        mine = repricer.requests_of(user)
        assert repricer.charge(user, mine[:1]) == again.charge(user, mine[:1])


def test_largest_remainder_breaks_ties_by_position() -> None:
    assert largest_remainder(10, {"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 0, "c": 1}) == {
        "a": 3,
        "b": 4,
        "c": 3,
    }
    assert largest_remainder(7, {"a": 0, "b": 5}, {"a": 0, "b": 1}) == {"a": 0, "b": 7}


def test_a_zero_bid_poison_refunds_nothing() -> None:
    batch = [
        AuctionRequest("a1", "alice", [1, 2, 3], 300_000),
        AuctionRequest("a2", "alice", [9, 9, 9], 0),
        AuctionRequest("b1", "bob", [1, 2, 4], 200_000),
        AuctionRequest("c1", "carol", [5, 6], 100_000),
    ]
    outcome = run_auction(batch)
    assert outcome.payments["alice"] > 0
    assert Repricer(batch).failure_refund("alice", {"a2"}, outcome.payments["alice"]) == 0
