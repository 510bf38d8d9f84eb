"""Property tests of the failure refund and the per-request shares against the slow oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionRequest, charges, run_auction
from inference_auctions.server.auction.charges import Repricer, largest_remainder
from inference_auctions.server.auction.reference import (
    ResolvingRepricer,
    reference_charge,
    reference_failure_refund,
    reference_shares,
)
from tests.auction.strategies import batches, long_batches, tied_batches


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


@st.composite
def big_batch_and_failures(
    draw: st.DrawFn,
) -> tuple[list[AuctionRequest], str, set[str]]:
    """A batch of up to 40, ties everywhere or not, one user and a subset of their requests."""
    batch = draw(st.one_of(batches(max_size=40), tied_batches(max_size=40)).filter(bool))
    user = draw(st.sampled_from(sorted({r.user for r in batch})))
    mine = [r.rid for r in batch if r.user == user]
    failed = set(draw(st.lists(st.sampled_from(mine), unique=True)))
    return batch, user, failed


@settings(max_examples=300)
@given(big_batch_and_failures())
def test_any_zeroed_subset_prices_as_re_solving_the_batch(
    case: tuple[list[AuctionRequest], str, set[str]],
) -> None:
    # The chosen schedule's repricing against the straightforward re-solve, on batches too big
    # for the trie oracle: every failed subset, and each request alone (the shares' marginals).
    batch, user, failed = case
    outcome = run_auction(batch)
    fast, slow = Repricer.from_outcome(outcome), ResolvingRepricer(batch)
    assert fast.charge(user) == slow.charge(user) == outcome.payments[user]
    assert fast.charge(user, failed) == slow.charge(user, failed)
    for rid in fast.requests_of(user):
        assert fast.charge(user, [rid]) == slow.charge(user, [rid])
    charge = outcome.payments[user]
    assert fast.failure_refund(user, failed, charge) == min(
        max(charge - slow.charge(user, failed), 0), charge
    )


@settings(max_examples=200)
@given(st.one_of(batches(max_size=40), tied_batches(max_size=40)).filter(bool))
def test_shares_from_the_outcome_equal_the_re_solved_shares(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    fast, rebuilt, slow = Repricer.from_outcome(outcome), Repricer(batch), ResolvingRepricer(batch)
    for user, charge in outcome.payments.items():
        shares = fast.shares(user, charge, outcome.positions)
        assert shares == slow.shares(user, charge, outcome.positions)
        assert shares == rebuilt.shares(user, charge, outcome.positions)
        assert sum(shares.values()) == charge


@given(tied_batches(max_size=9).filter(bool))
def test_tied_batches_match_the_trie_oracle(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    repricer = Repricer.from_outcome(outcome)
    for user, charge in outcome.payments.items():
        assert repricer.shares(user, charge, outcome.positions) == reference_shares(batch, user)
        every = set(repricer.requests_of(user))
        assert repricer.failure_refund(user, every, charge) == charge
        for rid in every:
            assert repricer.failure_refund(user, {rid}, charge) == reference_failure_refund(
                batch, user, {rid}
            )


def test_a_zeroed_bid_that_ties_yields_to_the_earlier_arrival() -> None:
    # With a1 zeroed, the prefix [1] averages (0 + 4,000 + 2,000) / 3 = 2,000, as bob does: bob
    # arrived first, so bob now goes first, and bob's and carol's welfare under that order is
    # what alice's charge reads. Repricing that kept [1] first on the tie would charge less.
    batch = [
        AuctionRequest("b1", "bob", [7], 2_000),
        AuctionRequest("a1", "alice", [1, 1], 3_000),
        AuctionRequest("a2", "alice", [1, 2], 4_000),
        AuctionRequest("c1", "carol", [1, 3], 2_000),
    ]
    outcome = run_auction(batch)
    assert outcome.order == ["a2", "a1", "c1", "b1"]
    repricer = Repricer.from_outcome(outcome)
    assert repricer.charge("alice", ["a1"]) == ResolvingRepricer(batch).charge("alice", ["a1"])
    assert repricer.charge("alice", ["a1"]) == reference_charge(batch, "alice", {"a1"})
    assert repricer.shares("alice", outcome.payments["alice"], outcome.positions) == (
        reference_shares(batch, "alice")
    )


def test_a_zero_charge_splits_into_zeros_and_a_lone_request_carries_all() -> None:
    batch = [
        AuctionRequest("a1", "alice", [1], 100),
        AuctionRequest("a2", "alice", [2], 50),
        AuctionRequest("b1", "bob", [3], 500),
    ]
    outcome = run_auction(batch)
    repricer = Repricer.from_outcome(outcome)
    assert outcome.payments["alice"] == 0
    assert outcome.payments["bob"] > 0
    assert repricer.shares("alice", 0, outcome.positions) == {"a1": 0, "a2": 0}
    assert repricer.shares("bob", outcome.payments["bob"], outcome.positions) == {
        "b1": outcome.payments["bob"]
    }


def test_repricing_a_cleared_batch_builds_no_tree_and_no_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = [
        AuctionRequest(f"r{i}", ["alice", "bob", "carol"][i % 3], [i % 2, i % 5], 1_000 * (i + 1))
        for i in range(12)
    ]
    outcome = run_auction(batch)
    paths = Repricer(batch).tree_paths()

    def rebuilt(*_: object) -> None:
        raise AssertionError("the batch was solved a second time")

    monkeypatch.setattr(charges, "build_radix_tree", rebuilt)
    monkeypatch.setattr(charges, "average_bid_dfs", rebuilt)
    monkeypatch.setattr(charges, "validate_batch", rebuilt)
    repricer = Repricer.from_outcome(outcome)
    slow = ResolvingRepricer(batch)
    for user, charge in outcome.payments.items():
        assert repricer.shares(user, charge, outcome.positions) == slow.shares(
            user, charge, outcome.positions
        )
    assert repricer.tree_paths() == paths
