from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from inference_auctions.billing import Ledger
from tests.billing.helpers import hold_and_settle
from tests.db_fixtures import MigratedDatabase


def test_reconcile_detects_a_tampered_balance(ledger: Ledger, ledger_db: MigratedDatabase) -> None:
    for name in ("alice", "bob", "carol"):
        ledger.create_user(name, budget_micros=1_000)
    hold_and_settle(ledger, "b1", [("r1", "alice", 500), ("r2", "bob", 100)], {"alice": 30})
    ledger.place_hold("carol", "r3", 200)
    report = ledger.reconcile()
    assert report.ok and report.accounts_checked == 3
    with ledger_db.engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE balances SET balance_micros = balance_micros + 5"
                " WHERE user_id = (SELECT id FROM users WHERE name = 'bob')"
            )
        )
        connection.execute(
            text(
                "UPDATE balances SET held_micros = 0"
                " WHERE user_id = (SELECT id FROM users WHERE name = 'carol')"
            )
        )
    report = ledger.reconcile()
    assert not report.ok
    assert [d.user for d in report.drifts] == ["bob", "carol"]
    bob, carol = report.drifts
    assert (bob.balance_micros, bob.expected_balance_micros) == (1_005, 1_000)
    assert (carol.held_micros, carol.expected_held_micros, carol.open_holds_micros) == (0, 200, 200)


@pytest.mark.parametrize(
    "statement",
    ["UPDATE ledger_entries SET amount_micros = 1", "DELETE FROM ledger_entries"],
)
def test_entries_cannot_be_rewritten(
    ledger: Ledger, ledger_db: MigratedDatabase, statement: str
) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    with pytest.raises(DBAPIError, match="append-only"), ledger_db.engine.begin() as connection:
        connection.execute(text(statement))
    assert ledger.reconcile().ok
