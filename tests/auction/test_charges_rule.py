"""The fixed-slots rule and the request fee (docs/SPEC.md) against the slow oracle, and the
junk-request attacks it closes, searched for by hypothesis on both rules."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionInputError, AuctionRequest, run_auction
from inference_auctions.server.auction.charges import PricingRule, Repricer
from inference_auctions.server.auction.reference import (
    ResolvingRepricer,
    all_dfs_orders,
    reference_failure_refund,
    reference_fees,
    reference_payments,
    reference_shares,
    welfare,
)
from tests.auction.strategies import batches, misreports

_FEE = st.sampled_from([0, 1, 1_000, 250_000])
# A junk request's prompt starts with a token no batch of `batches` uses: a fresh root.
_FRESH = 7


@st.composite
def ruled_batches(draw: st.DrawFn, max_size: int = 10) -> tuple[list[AuctionRequest], PricingRule]:
    """A non-empty batch and a fixed-slots rule with room for it (and for 4 more requests)."""
    batch = draw(batches(max_size=max_size).filter(bool))
    slots = draw(st.integers(min_value=len(batch), max_value=len(batch) + 20))
    return batch, PricingRule(slots=slots, request_fee_micros=draw(_FEE))


def _value(batch: list[AuctionRequest], user: str, order: list[str], slots: int) -> Fraction:
    """The user's value, judged with the bids of `batch`, of being served in `order`."""
    last = max(slots - 1, 1)
    place = {rid: k for k, rid in enumerate(order)}
    return sum(
        (
            Fraction(r.bid * (slots - 1 - place[r.rid]), last) if slots > 1 else Fraction(r.bid)
            for r in batch
            if r.user == user and r.rid in place
        ),
        start=Fraction(0),
    )


def _exact(batch: list[AuctionRequest], rule: PricingRule) -> dict[str, Fraction]:
    """Each user's exact VCG payment under `rule`, from the fast path's numerators."""
    outcome = run_auction(batch, rule)
    denominator = rule.denominator(len(batch))
    return {user: Fraction(value, denominator) for user, value in outcome.numerators.items()}


@given(ruled_batches(max_size=14))
def test_fixed_slots_payments_equal_the_oracles(
    case: tuple[list[AuctionRequest], PricingRule],
) -> None:
    batch, rule = case
    outcome = run_auction(batch, rule)
    naive = reference_payments(batch, rule.slots)
    assert _exact(batch, rule) == naive
    assert outcome.payments == {user: p.numerator // p.denominator for user, p in naive.items()}
    assert outcome.fees == reference_fees(batch, rule.request_fee_micros)
    assert outcome.welfare == welfare(
        [next(i for i, r in enumerate(batch) if r.rid == rid) for rid in outcome.order],
        [r.bid for r in batch],
        rule.slots,
    )


@given(ruled_batches(max_size=9), st.data())
def test_fixed_slots_refunds_and_shares_equal_the_oracles(
    case: tuple[list[AuctionRequest], PricingRule], data: st.DataObject
) -> None:
    batch, rule = case
    outcome = run_auction(batch, rule)
    user = data.draw(st.sampled_from(sorted(outcome.payments)))
    mine = [r.rid for r in batch if r.user == user]
    failed = set(data.draw(st.lists(st.sampled_from(mine), unique=True)))
    charge = outcome.payments[user]
    repricer = Repricer.from_outcome(outcome)
    assert repricer.failure_refund(user, failed, charge) == reference_failure_refund(
        batch, user, failed, rule.slots
    )
    assert Repricer(batch, rule).charge(user, failed) == ResolvingRepricer(
        batch, rule.slots
    ).charge(user, failed)
    assert repricer.shares(user, charge, outcome.positions) == reference_shares(
        batch, user, rule.slots
    )


@given(ruled_batches(max_size=12))
def test_the_order_and_the_welfare_ranking_do_not_depend_on_the_slots(
    case: tuple[list[AuctionRequest], PricingRule],
) -> None:
    # The fixed-slots welfare is the paper's plus (K-n) * sum(bids), which no order changes:
    # the same order is chosen on the same bids.
    batch, rule = case
    assert run_auction(batch, rule).order == run_auction(batch).order


@settings(max_examples=60)
@given(ruled_batches(max_size=6))
def test_fixed_slots_welfare_is_the_best_over_all_dfs_schedules(
    case: tuple[list[AuctionRequest], PricingRule],
) -> None:
    batch, rule = case
    bids = [r.bid for r in batch]
    best = max(welfare(order, bids, rule.slots) for order in all_dfs_orders(batch))
    assert run_auction(batch, rule).welfare == best


@given(ruled_batches(max_size=14))
def test_nobody_pays_more_than_the_bid_value_plus_the_announced_fee(
    case: tuple[list[AuctionRequest], PricingRule],
) -> None:
    batch, rule = case
    outcome = run_auction(batch, rule)
    for user in outcome.payments:
        requests = sum(1 for r in batch if r.user == user)
        value = _value(batch, user, outcome.order, outcome.slots)
        assert 0 <= _exact(batch, rule)[user] <= value
        assert outcome.fees[user] == requests * rule.request_fee_micros
        assert outcome.charge(user) <= value + requests * rule.request_fee_micros


@settings(max_examples=100)
@given(st.data())
def test_no_misreport_raises_a_users_utility_under_fixed_slots(data: st.DataObject) -> None:
    truth, rule = data.draw(ruled_batches(max_size=10))
    user = data.draw(st.sampled_from(sorted({r.user for r in truth})))
    lie = data.draw(misreports(truth, user))
    honest, strategic = run_auction(truth, rule), run_auction(lie, rule)
    # Utility is judged with the true bids; the fees are the same either way.
    honest_utility = _value(truth, user, honest.order, rule.slots or 0) - _exact(truth, rule)[user]
    lying_utility = _value(truth, user, strategic.order, rule.slots or 0) - _exact(lie, rule)[user]
    assert lying_utility <= honest_utility
    assert honest.fees[user] == strategic.fees[user]


def test_a_batch_larger_than_its_slots_is_refused_by_name() -> None:
    batch = [AuctionRequest(f"r{i}", "ann", [i], 5) for i in range(3)]
    with pytest.raises(AuctionInputError, match="3 requests, more than the rule's 2 priority"):
        run_auction(batch, PricingRule(slots=2))
    with pytest.raises(ValueError, match="slots must be a whole number >= 1"):
        PricingRule(slots=0)
    with pytest.raises(ValueError, match="fee must be whole micro-credits >= 0"):
        PricingRule(slots=4, request_fee_micros=-1)


# ---- The junk-request attacks (issue: "A market that junk requests cannot dilute") ---------


def _with_junk(batch: list[AuctionRequest], junk: int, sender: str) -> list[AuctionRequest]:
    """The batch and `junk` zero-bid requests of `sender` with fresh prompts (no shared prefix)."""
    return batch + [AuctionRequest(f"junk{j}", sender, [_FRESH, j], 0) for j in range(junk)]


def _diluted(batch: list[AuctionRequest], junk: int, rule: PricingRule) -> bool:
    """Whether junk lowers some user's exact VCG payment (the junk's sender included)."""
    before = _exact(batch, rule)
    sender = batch[0].user
    after = _exact(_with_junk(batch, junk, sender), rule)
    return any(after[user] < paid for user, paid in before.items())


_JUNK = st.integers(min_value=1, max_value=4)


# The searches run on both rules: on the paper's (batch-size slots, no fee) they must find the
# attack (a strict xfail), on the fixed-slots rule they must not. No shrinking: a failing case
# is reported as found, and the paper rule's search stops at its first.
_SEARCH = settings(
    max_examples=120, derandomize=True, phases=[Phase.explicit, Phase.generate], deadline=None
)
_PAPER_RULE_FAILS = pytest.mark.xfail(
    strict=True, raises=AssertionError, reason="the paper's rule is open to it"
)


@pytest.mark.parametrize("fixed", [pytest.param(False, marks=_PAPER_RULE_FAILS), True])
@_SEARCH
@given(batches(max_size=10).filter(bool), _JUNK, st.integers(min_value=0, max_value=10))
def test_junk_requests_lower_no_charge(
    fixed: bool, batch: list[AuctionRequest], junk: int, spare: int
) -> None:
    rule = PricingRule(slots=len(batch) + junk + spare) if fixed else PricingRule()
    assert not _diluted(batch, junk, rule)
    # Nobody's order moves either: the junk goes after every positive bid.
    before = run_auction(batch, rule).order
    after = run_auction(_with_junk(batch, junk, batch[0].user), rule).order
    assert [rid for rid in after if not rid.startswith("junk")][: len(before)] == before


def _decoy_gain(
    batch: list[AuctionRequest], attacker: str, decoys: list[AuctionRequest], rule: PricingRule
) -> Fraction:
    """The attacker's exact utility with its zero-bid `decoys` in the batch minus without,
    fees included, judged with the true bids. The slots grow with the batch on the paper rule."""
    attacked = batch + decoys
    honest, schemed = run_auction(batch, rule), run_auction(attacked, rule)
    slots_before = rule.slots or len(batch)
    slots_after = rule.slots or len(attacked)
    before = _value(batch, attacker, honest.order, slots_before) - _exact(batch, rule)[attacker]
    after = _value(batch, attacker, schemed.order, slots_after) - _exact(attacked, rule)[attacker]
    return after - before - (schemed.fees[attacker] - honest.fees[attacker])


def _reorders(batch: list[AuctionRequest], decoys: list[AuctionRequest], rule: PricingRule) -> bool:
    """Whether the decoys change the order of the batch's own requests."""
    real = {r.rid for r in batch}
    after = [rid for rid in run_auction(batch + decoys, rule).order if rid in real]
    return after != run_auction(batch, rule).order


def _decoy_cost(
    batch: list[AuctionRequest], attacker: str, decoys: list[AuctionRequest], rule: PricingRule
) -> int:
    """What the decoys themselves cost their sender: the fees the sender pays with them in the
    batch beyond those without (a zero bid pays no VCG charge)."""
    honest, schemed = run_auction(batch, rule), run_auction(batch + decoys, rule)
    return schemed.fees[attacker] - honest.fees[attacker]


@st.composite
def decoy_attacks(
    draw: st.DrawFn,
) -> tuple[list[AuctionRequest], str, list[AuctionRequest]]:
    """A batch, an attacker in it, and 1-4 zero-bid decoys under other users' prompt prefixes."""
    batch = draw(batches(max_size=8).filter(lambda b: len({r.user for r in b}) > 1))
    attacker = draw(st.sampled_from(sorted({r.user for r in batch})))
    targets = [list(r.tokens) for r in batch if r.user != attacker]
    decoys = []
    for j in range(draw(st.integers(min_value=1, max_value=4))):
        target = draw(st.sampled_from(targets))
        cut = draw(st.integers(min_value=0, max_value=len(target)))
        prompt = [int(token) for token in target[:cut]]
        decoys.append(AuctionRequest(f"decoy{j}", attacker, [*prompt, _FRESH], 0))
    return batch, attacker, decoys


def _free_reorder(
    batch: list[AuctionRequest], attacker: str, decoys: list[AuctionRequest], rule: PricingRule
) -> bool:
    """Decoys that reorder the batch while their sender pays nothing for them."""
    return _reorders(batch, decoys, rule) and _decoy_cost(batch, attacker, decoys, rule) <= 0


@pytest.mark.parametrize("fixed", [pytest.param(False, marks=_PAPER_RULE_FAILS), True])
@_SEARCH
@given(decoy_attacks(), st.integers(min_value=1, max_value=10**6))
def test_decoys_never_reorder_a_batch_for_free(
    fixed: bool, case: tuple[list[AuctionRequest], str, list[AuctionRequest]], fee: int
) -> None:
    batch, attacker, decoys = case
    slots = len(batch) + len(decoys) + 2
    rule = PricingRule(slots=slots, request_fee_micros=fee) if fixed else PricingRule()
    assert not _free_reorder(batch, attacker, decoys, rule)
    if fixed:
        assert _decoy_cost(batch, attacker, decoys, rule) == len(decoys) * fee


# ---- The worked examples (P, Q: distinct first tokens; X: a shared suffix) ---------
_P, _Q, _X = 1, 2, 3
_CREDIT = 1_000_000


def _a_and_c(a_bid: int, c_bid: int, extra: list[AuctionRequest]) -> list[AuctionRequest]:
    return [
        AuctionRequest("a", "A", [_P, _X], a_bid * _CREDIT),
        AuctionRequest("c", "C", [_Q, _X], c_bid * _CREDIT),
        *extra,
    ]


def _junk(count: int) -> list[AuctionRequest]:
    return [AuctionRequest(f"junk{j}", "A", [_FRESH, j], 0) for j in range(count)]


def test_price_dilution_example_on_both_rules() -> None:
    # The paper's rule: A pays 6 alone with C, 3 with one junk request, 1.2 with four.
    paper = [run_auction(_a_and_c(10, 6, _junk(m))).payments["A"] for m in (0, 1, 4)]
    assert paper == [6 * _CREDIT, 3 * _CREDIT, 1_200_000]
    # Fixed slots (K = 8): 6 credits over 7 slots whatever the junk; nobody's order moves.
    rule = PricingRule(slots=8)
    fixed = [run_auction(_a_and_c(10, 6, _junk(m)), rule) for m in (0, 1, 4)]
    assert [outcome.payments["A"] for outcome in fixed] == [6 * _CREDIT // 7] * 3
    assert all(outcome.order[:2] == ["a", "c"] for outcome in fixed)


def test_subtree_dilution_example_on_both_rules() -> None:
    decoys = [AuctionRequest(f"d{j}", "A", [_Q, 9, j], 0) for j in range(2)]
    honest, schemed = run_auction(_a_and_c(6, 10, [])), run_auction(_a_and_c(6, 10, decoys))
    # The paper's rule: C first, A second; two zero-bid decoys under Q put A first. Welfare on
    # the true bids falls from 10 to 6 credits, the decoys pay nothing, and A gains: A pays 10/3
    # for a first place worth 6.
    assert honest.order == ["c", "a"] and schemed.order[:2] == ["a", "c"]
    assert honest.welfare == 10 * _CREDIT and honest.payments["A"] == 0
    real = {"a": 6 * _CREDIT, "c": 10 * _CREDIT}
    assert sum(real[r] * schemed.priority(r) for r in real) == 6 * _CREDIT + Fraction(20, 3) * (
        _CREDIT
    )
    assert schemed.payments["A"] == 10 * _CREDIT // 3 and schemed.fees["A"] == 0
    assert _decoy_gain(_a_and_c(6, 10, []), "A", decoys, PricingRule()) == Fraction(8, 3) * _CREDIT
    # Fixed slots (K = 8): first place is worth 6/7 more than second and costs 10/7: a loss,
    # and with a fee each decoy costs it too.
    rule = PricingRule(slots=8, request_fee_micros=10_000)
    gain = _decoy_gain(_a_and_c(6, 10, []), "A", decoys, rule)
    assert gain == Fraction(6 - 10, 7) * _CREDIT - 2 * 10_000
    assert run_auction(_a_and_c(6, 10, decoys), rule).fees == {"A": 30_000, "C": 10_000}
