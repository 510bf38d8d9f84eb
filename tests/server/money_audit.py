"""The closing check of the hostile-client tests: money against what the clients got.

Each test says, per request, what its client received; this audit checks the ledger agrees:
a request whose client got its whole answer is `served`; one whose client left after its
first token is `abandoned` and keeps its charge; one whose client left before its first token
(or that failed) is `failed` and its user's charge for the batch was refunded; nothing is left
held, and every balance reconciles with its entries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from inference_auctions.billing import Ledger

__all__ = ["audit_money_against_answers", "net_charge"]


def net_charge(ledger: Ledger, user: str, batch_id: str) -> int:
    """The user's charges in the batch net of its refunds (micro-credits, positive = paid)."""
    total = 0
    for entry in ledger.entries(user, limit=1000).entries:
        if entry.batch_id == batch_id and entry.kind in ("charge", "refund"):
            total -= entry.amount_micros
    return total


def audit_money_against_answers(ledger: Ledger, outcomes: Mapping[str, str]) -> None:
    """`outcomes`: ledger rid (`user/rid`) -> the status its client's experience implies."""
    refunded_batches: dict[tuple[str, str], bool] = defaultdict(bool)
    for rid, expected in outcomes.items():
        found = ledger.find_request(rid)
        assert found is not None, f"{rid}: no batch settled it"
        assert str(found.status) == expected, f"{rid}: recorded {found.status}, expected {expected}"
        if expected == "failed":
            refunded_batches[(found.user, found.batch_id)] = True
    for (user, batch_id), _ in refunded_batches.items():
        assert net_charge(ledger, user, batch_id) == 0, f"{user} still pays for {batch_id}"
    for user in {rid.split("/", 1)[0] for rid in outcomes}:
        assert ledger.balance(user).held_micros == 0, f"{user} has money left held"
    report = ledger.reconcile()
    assert report.ok, report
