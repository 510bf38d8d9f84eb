"""Batches claimed in a group commit (`Ledger.commit_group`): after the group's holds, each
alone in its failure, and on the rows the group locked once.

A claim that fails (here its clearing raises, as a bug would, or its batch is invalid) gets
its error as its result and writes nothing; the holds of the group, its other claims and its
served records commit as if it had not been there.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from inference_auctions.billing import (
    BatchClaim,
    BatchInput,
    ChargeExceedsHold,
    ClaimedBatch,
    HoldInput,
    HoldView,
    Ledger,
    RequestInput,
)
from tests.billing.helpers import claim_of


def _broken(rid: str, user: str) -> BatchClaim:
    def clear(rids: list[str]) -> tuple[BatchInput, Sequence[RequestInput], dict[str, int]]:
        raise RuntimeError("a bug in the clearing")

    return BatchClaim([(rid, user)], clear)


def test_a_failing_claim_is_undone_alone(ledger: Ledger) -> None:
    ledger.create_user("ada", budget_micros=10_000)
    ledger.create_user("bob", budget_micros=10_000)
    ledger.place_holds([HoldInput("ada", "a1", 1_000), HoldInput("bob", "b1", 1_000)])
    outcome = ledger.commit_group(
        [HoldInput("ada", "a2", 2_000), HoldInput("bob", "b2", 3_000)],
        [],
        [
            _broken("a1", "ada"),
            claim_of("good", {"b1": ("bob", 1_000), "b2": ("bob", 3_000)}, 1_500),
            claim_of("invalid", {"a2": ("ada", 2_000)}, 5_000),  # charges above the hold
        ],
    )
    assert [type(p) for p in outcome.placed] == [HoldView, HoldView]
    broken, good, invalid = outcome.claimed
    assert isinstance(broken, RuntimeError)
    assert isinstance(invalid, ChargeExceedsHold)
    assert isinstance(good, ClaimedBatch) and good.settled is not None
    assert dict(good.settled.charges_micros) == {"bob": 1_500}
    # ada: both holds still open (a1 from before, a2 from this group), nothing charged.
    ada = ledger.balance("ada")
    assert (ada.balance_micros, ada.held_micros) == (10_000, 3_000)
    bob = ledger.balance("bob")
    assert (bob.balance_micros, bob.held_micros) == (10_000 - 1_500, 0)
    assert ledger.reconcile().ok


def test_a_claim_sees_the_holds_its_group_placed_before_it(ledger: Ledger) -> None:
    ledger.create_user("ada", budget_micros=5_000)
    outcome = ledger.commit_group(
        [HoldInput("ada", "a1", 2_000), HoldInput("ada", "a2", 4_000)],  # a2: too much
        [],
        [claim_of("b", {"a1": ("ada", 2_000), "a2": ("ada", 4_000)}, 700)],
    )
    assert [type(p).__name__ for p in outcome.placed] == ["HoldView", "InsufficientFunds"]
    [claimed] = outcome.claimed
    assert isinstance(claimed, ClaimedBatch) and claimed.settled is not None
    assert dict(claimed.refused) == {"a2": "unknown"}
    assert dict(claimed.settled.charges_micros) == {"ada": 700}
    ada = ledger.balance("ada")
    assert (ada.balance_micros, ada.held_micros) == (5_000 - 700, 0)
    assert ledger.reconcile().ok


@pytest.mark.parametrize("failing", [0, 1])
def test_the_group_runs_once_per_failed_claim_at_most(ledger: Ledger, failing: int) -> None:
    ledger.create_user("ada", budget_micros=10_000)
    ledger.place_holds([HoldInput("ada", "a1", 1_000), HoldInput("ada", "a2", 1_000)])
    runs: list[str] = []
    good = claim_of("g", {"a2": ("ada", 1_000)}, 100)
    original = good.clear

    def counted(rids: list[str]) -> tuple[BatchInput, Sequence[RequestInput], dict[str, int]]:
        runs.append("good")
        return original(rids)

    claims = [_broken("a1", "ada"), BatchClaim(good.candidates, counted)]
    if failing == 1:
        claims.reverse()
    outcome = ledger.commit_group([], [], claims)
    assert sum(isinstance(c, RuntimeError) for c in outcome.claimed) == 1
    # The good claim ran in the failed attempt only if it came first, and once more after.
    assert runs == (["good", "good"] if failing == 1 else ["good"])
    assert ledger.balance("ada").held_micros == 1_000
    assert ledger.reconcile().ok


def test_a_group_reports_what_its_users_have_available_after_it(ledger: Ledger) -> None:
    ledger.create_user("ada", budget_micros=100_000)
    ledger.create_user("bob", budget_micros=100_000)
    ledger.create_user("cap", budget_micros=100_000, batch_cap_micros=10_000)
    ledger.create_user("off", budget_micros=100_000)
    ledger.disable_user("off")
    holds = [
        HoldInput("ada", "a1", 30_000),
        HoldInput("bob", "b1", 20_000),
        HoldInput("cap", "c1", 5_000),
        HoldInput("off", "o1", 5_000),
    ]
    settle = claim_of("g1", {"b1": ("bob", 20_000)}, 7_000)
    outcome = ledger.commit_group(holds, [], [settle])
    # bob's hold is claimed and settled in the same group: charged 7,000, nothing held.
    assert outcome.available == {"ada": 70_000, "bob": 93_000}
    for name, available in outcome.available.items():
        assert ledger.balance(name).available_micros == available
