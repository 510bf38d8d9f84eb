from __future__ import annotations

import pytest
from sqlalchemy import text

from inference_auctions.billing import DuplicateUser, InvalidInput, Ledger, Period, UnknownUser
from tests.db_fixtures import MigratedDatabase


def test_create_user_grants_the_budget_and_shows_the_key_once(
    ledger: Ledger, ledger_db: MigratedDatabase
) -> None:
    created = ledger.create_user("alice", budget_micros=2_000_000, period="day", admin=True)
    assert created.api_key.startswith("iak_")
    assert created.api_key not in repr(created)
    assert created.user.is_admin and created.user.period is Period.DAY
    assert ledger.balance("alice").available_micros == 2_000_000
    with ledger_db.engine.connect() as connection:
        stored = connection.execute(text("SELECT key_hash FROM api_keys")).scalar_one()
    assert created.api_key not in stored and len(stored) == 64


def test_authenticate_matches_only_the_exact_key(ledger: Ledger) -> None:
    key = ledger.create_user("alice", budget_micros=1).api_key
    ledger.create_user("bob", budget_micros=1)
    user = ledger.authenticate(key)
    assert user is not None and user.name == "alice"
    tampered = key[:-1] + ("A" if key[-1] != "A" else "B")
    for wrong in (tampered, key[:20], "", "iak_", "Bearer " + key, key + "x"):
        assert ledger.authenticate(wrong) is None


def test_rotating_the_key_revokes_the_old_one(ledger: Ledger) -> None:
    old = ledger.create_user("alice", budget_micros=1).api_key
    new = ledger.rotate_api_key("alice")
    assert ledger.authenticate(old) is None
    user = ledger.authenticate(new)
    assert user is not None and user.name == "alice"


def test_disable_and_enable_are_idempotent_and_visible(ledger: Ledger) -> None:
    key = ledger.create_user("alice", budget_micros=1).api_key
    assert ledger.disable_user("alice").disabled
    assert ledger.disable_user("alice").disabled
    user = ledger.authenticate(key)
    assert user is not None and user.disabled
    assert not ledger.enable_user("alice").disabled


def test_list_users_is_sorted(ledger: Ledger) -> None:
    for name in ("carol", "alice", "bob"):
        ledger.create_user(name, budget_micros=0)
    assert [u.name for u in ledger.list_users()] == ["alice", "bob", "carol"]


def test_duplicate_and_unknown_users(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1)
    with pytest.raises(DuplicateUser, match="user 'alice' already exists"):
        ledger.create_user("alice", budget_micros=1)
    with pytest.raises(UnknownUser, match="unknown user 'zed'"):
        ledger.get_user("zed")


def test_set_budget_changes_only_the_given_fields(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=10, batch_cap_micros=5)
    info = ledger.set_budget("alice", budget_micros=20, period="week", timezone="Europe/Paris")
    # A lifetime budget becomes weekly at the next Paris week start; until then it is as it was.
    assert (info.budget_micros, info.period, info.timezone) == (10, Period.NONE, "UTC")
    assert (info.pending_budget_micros, info.pending_period, info.pending_timezone) == (
        20,
        Period.WEEK,
        "Europe/Paris",
    )
    assert info.batch_cap_micros == 5
    info = ledger.set_budget("alice", batch_cap_micros=None)
    assert info.batch_cap_micros is None and info.pending_budget_micros == 20
    assert ledger.balance("alice").balance_micros == 10


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "bad name"}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 65}, "name"),
        ({"budget_micros": -1}, "budget_micros"),
        ({"budget_micros": 1.5}, "budget_micros"),
        ({"period": "year"}, "period"),
        ({"timezone": "Nowhere/Land"}, "timezone"),
        ({"batch_cap_micros": 0}, "batch_cap_micros"),
    ],
)
def test_create_user_refuses_bad_input(
    ledger: Ledger, kwargs: dict[str, object], field: str
) -> None:
    args: dict[str, object] = {"name": "alice", "budget_micros": 1, **kwargs}
    with pytest.raises(InvalidInput) as caught:
        ledger.create_user(**args)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert ledger.list_users() == []
