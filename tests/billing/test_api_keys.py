"""Several named keys per user with an expiry, per-user rate limits, and the record of every
administrative action: on the ledger, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from inference_auctions.billing import (
    DuplicateApiKey,
    IdempotencyConflict,
    InvalidInput,
    Ledger,
    UnknownApiKey,
    apikeys,
    migrate,
)
from tests.db_fixtures import MigratedDatabase

START = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


def test_a_user_holds_several_named_keys_and_each_is_revoked_alone(ledger: Ledger) -> None:
    default = ledger.create_user("alice", budget_micros=1).api_key
    ci = ledger.create_api_key("alice", "ci")
    laptop = ledger.create_api_key("alice", "laptop")
    assert [k.name for k in ledger.api_keys("alice")] == ["default", "ci", "laptop"]
    assert all(ledger.authenticate(k) is not None for k in (default, ci.api_key, laptop.api_key))
    assert ci.key.prefix == apikeys.key_prefix(ci.api_key)
    with pytest.raises(DuplicateApiKey, match="already has an API key named 'ci'"):
        ledger.create_api_key("alice", "ci")
    assert ledger.get_user("alice").sessions_from is None
    revoked = ledger.revoke_api_key("alice", "ci")
    assert revoked.revoked_at is not None
    # Dashboard sessions do not record their key: revoking one ends them all.
    assert ledger.get_user("alice").sessions_from == revoked.revoked_at
    assert ledger.authenticate(ci.api_key) is None
    assert ledger.authenticate(laptop.api_key) is not None
    assert [k.name for k in ledger.api_keys("alice")] == ["default", "laptop"]
    assert [k.name for k in ledger.api_keys("alice", revoked=True)] == [
        "default",
        "ci",
        "laptop",
    ]
    with pytest.raises(UnknownApiKey, match="no API key named 'ci'"):
        ledger.revoke_api_key("alice", "ci")
    # The name is free again once its key is revoked.
    assert ledger.authenticate(ledger.create_api_key("alice", "ci").api_key) is not None


def test_a_key_stops_working_at_its_expiry(ledger_db: MigratedDatabase) -> None:
    clock = Clock()
    ledger = Ledger(ledger_db.engine, clock=clock)
    ledger.create_user("alice", budget_micros=1)
    issued = ledger.create_api_key("alice", "temp", expires_at=START + timedelta(hours=1))
    assert ledger.authenticate(issued.api_key) is not None
    clock.now = START + timedelta(minutes=59, seconds=59)
    assert ledger.authenticate(issued.api_key) is not None
    clock.now = START + timedelta(hours=1)
    assert ledger.authenticate(issued.api_key) is None
    with pytest.raises(InvalidInput, match=r"expires_at: .* has already passed"):
        ledger.create_api_key("alice", "late", expires_at=START)
    with pytest.raises(InvalidInput, match="key_name"):
        ledger.create_api_key("alice", "no spaces")


def test_rotation_revokes_every_key(ledger: Ledger) -> None:
    old = ledger.create_user("alice", budget_micros=1).api_key
    extra = ledger.create_api_key("alice", "ci").api_key
    new = ledger.rotate_api_key("alice")
    assert ledger.authenticate(old) is None and ledger.authenticate(extra) is None
    assert ledger.authenticate(new) is not None
    assert [k.name for k in ledger.api_keys("alice")] == ["default"]


def test_rate_limits_are_set_checked_and_read_back(ledger: Ledger) -> None:
    key = ledger.create_user("alice", budget_micros=1, requests_per_minute=5).api_key
    info = ledger.set_rate_limits("alice", tokens_per_minute=1000)
    assert (info.requests_per_minute, info.tokens_per_minute) == (5, 1000)
    user = ledger.authenticate(key)
    assert user is not None and user.tokens_per_minute == 1000
    info = ledger.set_rate_limits("alice", requests_per_minute=None)
    assert (info.requests_per_minute, info.tokens_per_minute) == (None, 1000)
    for bad in (0, -1, True, 10**13):
        with pytest.raises(InvalidInput, match="tokens_per_minute"):
            ledger.set_rate_limits("alice", tokens_per_minute=bad)
    assert ledger.get_user("alice").tokens_per_minute == 1000


def test_every_change_is_recorded_with_who_made_it(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000_000, period="day", actor="root")
    ledger.create_api_key("alice", "ci", actor="root")
    ledger.set_rate_limits("alice", requests_per_minute=60, actor="cli:ops")
    ledger.disable_user("alice", actor="root")
    ledger.enable_user("alice", actor="root")
    ledger.grant("alice", datetime.now(UTC), 500_000, actor="root")
    ledger.grant("alice", datetime.now(UTC), 500_000, actor="root")  # a replay: not recorded
    ledger.adjust("alice", -100, reason="typo", key="fix-1", actor="cli:ops")
    ledger.adjust("alice", -100, reason="typo", key="fix-1", actor="cli:ops")
    with pytest.raises(IdempotencyConflict):
        ledger.adjust("alice", -200, reason="typo", key="fix-1", actor="cli:ops")
    ledger.rotate_api_key("alice", actor="root")
    ledger.revoke_api_key("alice", "default", actor="root")
    ledger.set_budget("alice", batch_cap_micros=10, actor="root")
    ledger.create_user("bob", budget_micros=0)
    actions = ledger.admin_actions()
    assert [(a.actor, a.action, a.user) for a in actions] == [
        ("root", "create_user", "alice"),
        ("root", "create_key", "alice"),
        ("cli:ops", "set_limits", "alice"),
        ("root", "disable_user", "alice"),
        ("root", "enable_user", "alice"),
        ("root", "grant", "alice"),
        ("cli:ops", "adjust", "alice"),
        ("root", "rotate_key", "alice"),
        ("root", "revoke_key", "alice"),
        ("root", "set_budget", "alice"),
        ("library", "create_user", "bob"),
    ]
    assert actions[6].details == {
        "amount_micros": -100,
        "entry_id": actions[6].details["entry_id"],
        "key": "fix-1",
        "reason": "typo",
    }
    assert actions[9].details == {"batch_cap_micros": 10}
    assert [a.action for a in ledger.admin_actions(user="bob")] == ["create_user"]
    page = ledger.admin_actions(after_id=actions[2].id, limit=2)
    assert [a.id for a in page] == [actions[3].id, actions[4].id]


def test_a_refused_change_records_nothing(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1)
    with pytest.raises(InvalidInput):
        ledger.set_rate_limits("alice", requests_per_minute=0, actor="root")
    with pytest.raises(InvalidInput, match="actor"):
        ledger.disable_user("alice", actor="")
    assert not ledger.get_user("alice").disabled
    assert [a.action for a in ledger.admin_actions()] == ["create_user"]


def _old_schema_user(db: MigratedDatabase, name: str) -> str:
    """Insert a user as the schema before named keys held one (its key in `users`)."""
    key = apikeys.generate_key()
    with db.engine.begin() as connection:
        user_id = connection.execute(
            text(
                "INSERT INTO users (name, api_key_prefix, api_key_hash, is_admin, disabled,"
                " created_at) VALUES (:n, :p, :h, false, false, :t) RETURNING id"
            ),
            {"n": name, "p": key.prefix, "h": key.digest, "t": START},
        ).scalar_one()
        connection.execute(
            text(
                "INSERT INTO budgets (user_id, amount_micros, period, timezone,"
                " current_period_start, updated_at) VALUES (:u, 0, 'none', 'UTC', :t, :t)"
            ),
            {"u": user_id, "t": START},
        )
        connection.execute(
            text(
                "INSERT INTO balances (user_id, balance_micros, held_micros, updated_at)"
                " VALUES (:u, 0, 0, :t)"
            ),
            {"u": user_id, "t": START},
        )
    return key.key


def test_keys_issued_before_the_upgrade_keep_working(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.engine)
    alice = ledger.create_user("alice", budget_micros=1).api_key
    ledger.create_api_key("alice", "ci")
    migrate.downgrade(ledger_db.engine, "8e1b4c7a2f60")  # the schema before named keys
    with ledger_db.engine.connect() as connection:
        stored = connection.execute(
            text("SELECT api_key_hash FROM users WHERE name = 'alice'")
        ).scalar_one()
    # The older schema keeps one key per user: the newest one it held.
    assert stored != apikeys.hash_key(alice)
    bob = _old_schema_user(ledger_db, "bob")
    migrate.upgrade(ledger_db.engine)
    assert migrate.schema_drift(ledger_db.engine) == []
    user = ledger.authenticate(bob)
    assert user is not None and user.name == "bob"
    assert [k.name for k in ledger.api_keys("bob")] == ["default"]
    assert ledger.authenticate(alice) is None  # the older schema could not keep it
    assert [k.name for k in ledger.api_keys("alice")] == ["default"]
