"""Group commit of holds: `place_holds` decides each hold as `place_hold` one by one would."""

from __future__ import annotations

import itertools
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session

from inference_auctions.billing import (
    HoldInput,
    HoldView,
    InsufficientFunds,
    Ledger,
    LedgerError,
    LedgerUnavailable,
)
from tests.billing import hold_oracle
from tests.billing.conftest import Clock
from tests.billing.helpers import get_hold, snapshot
from tests.db_fixtures import MigratedDatabase

START = datetime(2025, 1, 15, 12, 0, tzinfo=UTC)
USERS = ["alice", "bob", "carol"]
RIDS = ["r0", "r1", "r2", "r3", "old", "keep", "cold"]

_examples = itertools.count()


def _set_up(ledger: Ledger, clock: Clock, p: str) -> None:
    """alice: a daily budget, a released hold `old` and an open one `keep`; bob: a batch cap;
    carol: an open hold `cold`, then disabled. Then the day ends, so alice's period is due."""
    clock.now = START
    ledger.create_user(p + "alice", budget_micros=1_000, period="day")
    ledger.create_user(p + "bob", budget_micros=2_000, batch_cap_micros=700)
    ledger.create_user(p + "carol", budget_micros=1_000)
    ledger.place_hold(p + "alice", p + "old", 300, "fa")
    ledger.release(p + "old")
    ledger.place_hold(p + "alice", p + "keep", 100, "fa")
    ledger.place_hold(p + "carol", p + "cold", 200)
    ledger.disable_user(p + "carol")
    clock.now = START + timedelta(days=1)


@st.composite
def _requests(draw: st.DrawFn) -> list[tuple[str, str, int, str | None]]:
    user = st.sampled_from([*USERS, "nobody"]) | st.just("not a name!")
    rid = st.sampled_from(RIDS) | st.just("")
    amount = st.sampled_from([0, 100, 200, 300, 450, 700]) | st.just(-5)
    fingerprint = st.sampled_from([None, "fa", "fb"])
    return draw(st.lists(st.tuples(user, rid, amount, fingerprint), min_size=1, max_size=14))


def _request(p: str, user: str, rid: str, amount: int, fingerprint: str | None) -> HoldInput:
    # Invalid names and rids stay as they are: prefixed they could become valid.
    return HoldInput(user if " " in user else p + user, rid and p + rid, amount, fingerprint)


def _normal(p: str, text: str | None) -> str | None:
    # Two users of one database differ in their ids; keys carry them (`grant:<id>:...`).
    return None if text is None else re.sub(r":\d+:", ":<id>:", text.replace(p, ""))


def _outcome(p: str, result: HoldView | LedgerError | None) -> object:
    if isinstance(result, LedgerError):
        return type(result).__name__, _normal(p, str(result))
    if result is None:
        return None
    return (
        _normal(p, result.rid),
        _normal(p, result.user),
        result.amount_micros,
        result.state,
        result.created_at,
        result.batch_id,
    )


def _state(ledger: Ledger, p: str) -> object:
    balances = []
    for user in USERS:
        view = ledger.balance(p + user)
        entries = [
            (
                e.kind,
                e.amount_micros,
                _normal(p, e.request_id),
                _normal(p, e.reason),
                _normal(p, e.idempotency_key),
                e.created_at,
                e.period_start,
            )
            for e in ledger.entries(p + user, limit=1000).entries
        ]
        balances.append((view.balance_micros, view.held_micros, view.period_start, entries))
    holds = [_outcome(p, get_hold(ledger, p + rid)) for rid in RIDS]
    return balances, holds


def _place_alone(db: MigratedDatabase, clock: Clock, request: HoldInput) -> HoldView:
    # The per-hold ORM path, in a transaction of its own: what `place_hold` always did.
    with Session(db.engine, expire_on_commit=False) as session, session.begin():
        return hold_oracle.place_hold(
            session, request.user, request.rid, request.amount_micros, clock(), request.fingerprint
        )


@settings(
    max_examples=15,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(requests=_requests())
def test_a_group_decides_as_one_hold_after_another(
    ledger_db: MigratedDatabase, clock: Clock, requests: list[tuple[str, str, int, str | None]]
) -> None:
    ledger = Ledger(ledger_db.engine, clock=clock)
    n = next(_examples)
    one, many, committed = f"s{n}-", f"g{n}-", f"c{n}-"
    _set_up(ledger, clock, one)
    singly: list[HoldView | LedgerError] = []
    for fields in requests:
        request = _request(one, *fields)
        try:
            view = _place_alone(ledger_db, clock, request)
        except LedgerError as error:
            singly.append(error)
        else:
            singly.append(view)
    _set_up(ledger, clock, many)
    grouped = ledger.place_holds([_request(many, *fields) for fields in requests])
    assert [_outcome(many, r) for r in grouped] == [_outcome(one, r) for r in singly]
    assert _state(ledger, many) == _state(ledger, one)
    # The server's writer places them as part of a group commit: reads first, writes
    # deferred to the commit on PostgreSQL (`billing.group_commit`). The same decisions.
    _set_up(ledger, clock, committed)
    outcome = ledger.commit_group([_request(committed, *fields) for fields in requests], [])
    assert [_outcome(committed, r) for r in outcome.placed] == [_outcome(one, r) for r in singly]
    assert _state(ledger, committed) == _state(ledger, one)
    assert ledger.reconcile().ok


def test_a_refused_hold_changes_nothing_for_the_others(ledger: Ledger) -> None:
    ledger.create_user("ann", budget_micros=1_000)
    ledger.create_user("ben", budget_micros=1_000)
    results = ledger.place_holds(
        [
            HoldInput("ann", "a1", 600),
            HoldInput("ben", "b1", 1_500),  # refused
            HoldInput("ann", "a2", 600),  # refused: a1 took 600 of ann's 1,000
            HoldInput("nobody", "n1", 1),  # refused
            HoldInput("ann", "a3", 400),
            HoldInput("ann", "a1", 600),  # a replay
        ]
    )
    kinds = [type(r).__name__ for r in results]
    assert kinds == [
        "HoldView",
        "InsufficientFunds",
        "InsufficientFunds",
        "UnknownUser",
        "HoldView",
        "HoldView",
    ]
    refused = results[2]
    assert isinstance(refused, InsufficientFunds)
    assert (refused.available_micros, refused.requested_micros) == (400, 600)
    assert ledger.balance("ann").held_micros == 1_000
    assert ledger.balance("ben").held_micros == 0
    assert [e.kind.value for e in ledger.entries("ann").entries] == ["grant", "hold", "hold"]
    assert get_hold(ledger, "a2") is None and get_hold(ledger, "b1") is None
    assert ledger.reconcile().ok


def test_a_locked_database_is_unavailable_and_nothing_is_written(
    ledger_db: MigratedDatabase,
) -> None:
    ledger = Ledger(ledger_db.engine)
    ledger.create_user("ann", budget_micros=1_000)
    ledger.create_user("ben", budget_micros=1_000)
    before = snapshot(ledger_db.engine)
    impatient = Ledger(_impatient_engine(ledger_db))
    with ledger_db.engine.connect() as other:
        # Another writer holds the lock the group needs (SQLite: BEGIN IMMEDIATE took the
        # write lock), for longer than the group waits.
        transaction = other.begin()
        if ledger_db.backend == "postgres":
            other.execute(text("SELECT * FROM balances FOR UPDATE"))
        with pytest.raises(LedgerUnavailable):
            impatient.place_holds([HoldInput("ann", "a1", 10), HoldInput("ben", "b1", 10)])
        transaction.rollback()
    assert snapshot(ledger_db.engine) == before
    assert [type(r).__name__ for r in impatient.place_holds([HoldInput("ann", "a1", 10)])] == [
        "HoldView"
    ]


def _impatient_engine(db: MigratedDatabase) -> Engine:
    if db.backend == "sqlite":
        return db.new_engine(connect_args={"timeout": 0.2})
    engine = db.new_engine()

    @event.listens_for(engine, "connect")
    def _lock_timeout(connection: Any, _record: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        connection.commit()

    return engine


# Many threads placing groups of holds for the same few users at once.

THREADS = 8
GROUPS = 30
BUDGET = 40_000
CROWD = ["ann", "ben", "cat"]


@dataclass
class Seen:
    """What one thread was told."""

    placed: dict[str, tuple[str, int]] = field(default_factory=dict)
    refused: list[InsufficientFunds] = field(default_factory=list)
    other: list[LedgerError] = field(default_factory=list)


def _place_groups(ledger: Ledger, worker: int, seen: Seen) -> None:
    rng = random.Random(worker)
    for g in range(GROUPS):
        group = [
            HoldInput(rng.choice(CROWD), f"w{worker}-g{g}-{k}", rng.randint(1, 120))
            for k in range(rng.randint(1, 20))
        ]
        if rng.random() < 0.2:
            group.append(group[0])  # the same rid twice in one group is a replay
        for request, result in zip(group, ledger.place_holds(group), strict=True):
            if isinstance(result, HoldView):
                assert (result.rid, result.user) == (request.rid, request.user)
                seen.placed[result.rid] = (result.user, result.amount_micros)
            elif isinstance(result, InsufficientFunds):
                seen.refused.append(result)
            else:
                seen.other.append(result)


def test_concurrent_groups_never_overdraw_and_lose_nothing(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.new_engine(pool_size=THREADS + 2))
    for user in CROWD:
        ledger.create_user(user, budget_micros=BUDGET)
    seen = [Seen() for _ in range(THREADS)]
    failures: list[BaseException] = []
    lows: list[int] = []
    stop = threading.Event()

    def run(worker: int) -> None:
        try:
            _place_groups(ledger, worker, seen[worker])
        except BaseException as exc:
            failures.append(exc)

    def watch() -> None:
        while not stop.is_set():
            lows.extend(ledger.balance(user).available_micros for user in CROWD)
            stop.wait(0.005)

    workers = [threading.Thread(target=run, args=(w,)) for w in range(THREADS)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    watcher.join()
    assert not failures, failures
    assert lows and min(lows) >= 0
    assert all(not s.other for s in seen), [s.other for s in seen]

    placed = {rid: told for s in seen for rid, told in s.placed.items()}
    stored = {rid: told for user in CROWD for rid, told in _hold_entries(ledger, user).items()}
    assert stored == placed  # every hold a caller was told of, and no other
    for rid in random.Random(0).sample(sorted(placed), 40):
        hold = get_hold(ledger, rid)
        assert hold is not None and (hold.user, hold.amount_micros) == placed[rid]
    held: Counter[str] = Counter()
    for user, amount in placed.values():
        held[user] += amount
    refusals = [r for s in seen for r in s.refused]
    assert refusals, "the budgets are meant to run out"
    for user in CROWD:
        balance = ledger.balance(user)
        assert balance.held_micros == held[user] <= BUDGET
    for refusal in refusals:
        # Holds only grow here, so what is available at the end is at most what the refusal
        # saw: a refusal while enough was available would show up as more left at the end.
        assert refusal.available_micros < refusal.requested_micros
        assert ledger.balance(refusal.name).available_micros <= refusal.available_micros
    assert ledger.reconcile().ok


def _hold_entries(ledger: Ledger, user: str) -> dict[str, tuple[str, int]]:
    """rid -> (user, amount) of the user's hold entries; a rid held twice fails."""
    found: dict[str, tuple[str, int]] = {}
    cursor = None
    while True:
        page = ledger.entries(user, kind="hold", limit=1000, cursor=cursor)
        for entry in page.entries:
            assert entry.request_id is not None and entry.request_id not in found
            found[entry.request_id] = (user, entry.amount_micros)
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor
