"""The manipulation study, on a few instances: what it must find on each rule."""

from __future__ import annotations

from fractions import Fraction

from inference_auctions.experiments import manipulation
from inference_auctions.server.auction.charges import PricingRule


def test_the_study_finds_dilution_on_the_paper_rule_only() -> None:
    results, checks = manipulation.study_small(seed=7, count=2, oracle=False)
    by_key = {(r.rule, r.name): r for r in results}
    assert by_key[("paper", "dilution (fresh junk)")].profitable(0) > 0
    assert by_key[("fixed", "dilution (fresh junk)")].profitable(0) == 0
    # A fee only ever lowers the share of profitable decoys.
    decoys = by_key[("fixed", "decoys, own account")]
    shares = [decoys.profitable(i) for i in range(len(manipulation.FEE_SLOTS))]
    assert shares == sorted(shares, reverse=True)
    assert checks["misreports"] > 0
    assert checks["truthfulness violations"] == checks["IR violations"] == 0
    table = manipulation.report_small(results, checks, 16)
    assert table.count("\n|") == 7  # the separator and six attacks


def test_a_decoy_gain_is_exact_and_agrees_with_the_oracle() -> None:
    # The subtree dilution: C [Q, X] bids 10, A [P, X] 6, two decoys under Q.
    instance = manipulation.Instance(
        [
            manipulation.AuctionRequest("a", "A", [1, 3], 6_000_000),
            manipulation.AuctionRequest("c", "C", [2, 3], 10_000_000),
        ]
    )
    decoys = [manipulation.AuctionRequest(f"d{j}", "A", [2, 9, j], 0) for j in range(2)]
    attack = manipulation.Attack([*instance.requests, *decoys], {"A"}, 2)
    # The paper's rule: first place is worth 6 on the batch of two and costs 10/3.
    assert manipulation.gain(instance, {"A"}, attack, PricingRule()) == Fraction(8, 3) * 10**6
    assert manipulation.confirmed(instance, {"A"}, attack, PricingRule())
    # Fixed slots: worth 6/7 more than second place, for 10/7.
    fixed = PricingRule(slots=8)
    assert manipulation.gain(instance, {"A"}, attack, fixed) == Fraction(-4, 7) * 10**6
    assert not manipulation.confirmed(instance, {"A"}, attack, fixed)
