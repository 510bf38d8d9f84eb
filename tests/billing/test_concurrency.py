"""Many threads moving money for the same users at once: nothing overdrawn, nothing lost."""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field

from inference_auctions.billing import InsufficientFunds, Ledger
from tests.billing.helpers import batch_of, entries_total
from tests.db_fixtures import MigratedDatabase

USERS = ["ann", "ben", "cat", "dan"]
BUDGET = 20_000
THREADS = 16
ROUNDS = 10


@dataclass
class Tally:
    """What one thread saw succeed."""

    charged: Counter[str] = field(default_factory=Counter)
    entries: Counter[str] = field(default_factory=Counter)
    refused: int = 0


def _work(ledger: Ledger, worker: int, tally: Tally) -> None:
    rng = random.Random(worker)
    for round_ in range(ROUNDS):
        held: list[tuple[str, str, int]] = []
        for slot, user in enumerate(rng.sample(USERS, 2)):
            rid = f"w{worker}-r{round_}-{slot}"
            amount = rng.randint(0, 4_000)
            try:
                ledger.place_hold(user, rid, amount)
            except InsufficientFunds:
                tally.refused += 1
                continue
            tally.entries[user] += 1
            held.append((rid, user, amount))
        if not held:
            continue
        for _rid, user, _amount in held:
            tally.entries[user] += 1  # its release, by settlement or by hand
        if rng.random() < 0.2:
            for rid, _user, _amount in held:
                ledger.release(rid)
            continue
        charges: dict[str, int] = {}
        for _rid, user, amount in held:
            charges[user] = charges.get(user, 0) + rng.randint(0, amount)
        ledger.settle_batch(*batch_of(f"w{worker}-b{round_}", held, charges))
        for user, amount in charges.items():
            if amount:
                tally.charged[user] += amount
                tally.entries[user] += 1


def _watch(ledger: Ledger, stop: threading.Event, lows: list[int]) -> None:
    while not stop.is_set():
        lows.extend(ledger.balance(user).available_micros for user in USERS)


def test_threads_never_overdraw_and_lose_no_entry(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.new_engine(pool_size=THREADS + 2))
    for user in USERS:
        ledger.create_user(user, budget_micros=BUDGET)
    tallies = [Tally() for _ in range(THREADS)]
    failures: list[BaseException] = []
    stop = threading.Event()
    lows: list[int] = []

    def run(worker: int) -> None:
        try:
            _work(ledger, worker, tallies[worker])
        except BaseException as exc:
            failures.append(exc)

    watcher = threading.Thread(target=_watch, args=(ledger, stop, lows))
    workers = [threading.Thread(target=run, args=(k,)) for k in range(THREADS)]
    watcher.start()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    watcher.join()

    assert failures == []
    assert lows and min(lows) >= 0
    assert sum(t.refused for t in tallies) > 0, "the test should push users to their limit"
    charged = sum((t.charged for t in tallies), Counter())
    expected_entries = sum((t.entries for t in tallies), Counter())
    for user in USERS:
        view = ledger.balance(user)
        assert view.held_micros == 0
        assert view.balance_micros == BUDGET - charged[user]
        assert entries_total(ledger, user) == view.balance_micros
        entries = ledger.entries(user, limit=1000).entries
        assert len(entries) == 1 + expected_entries[user]  # the grant, then every move
    assert ledger.reconcile().ok
