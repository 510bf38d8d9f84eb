"""The API-key cache: a burst of requests for one key whose entry expired makes one read."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime

from inference_auctions.billing import Period, UserInfo
from inference_auctions.server.api.deps import AuthenticationCache

ALICE = UserInfo(
    name="alice",
    is_admin=False,
    disabled=False,
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
    budget_micros=1_000_000,
    period=Period.NONE,
    timezone="UTC",
    batch_cap_micros=None,
)


class SlowLedger:
    """A key lookup that takes a while and counts its calls (from worker threads)."""

    def __init__(self) -> None:
        self.reads = 0
        self._lock = threading.Lock()

    def authenticate(self, key: str) -> UserInfo | None:
        with self._lock:
            self.reads += 1
        time.sleep(0.05)
        return ALICE if key == "good" else None


def test_concurrent_misses_share_one_read_and_the_answer_is_cached() -> None:
    ledger = SlowLedger()
    cache = AuthenticationCache(ttl=60)

    async def run() -> list[UserInfo | None]:
        return await asyncio.gather(*(cache.lookup("good", ledger.authenticate) for _ in range(50)))

    assert asyncio.run(run()) == [ALICE] * 50
    assert ledger.reads == 1
    assert asyncio.run(cache.lookup("good", ledger.authenticate)) == ALICE
    assert ledger.reads == 1  # cached


def test_an_unknown_key_is_shared_but_not_cached() -> None:
    ledger = SlowLedger()
    cache = AuthenticationCache(ttl=60)

    async def burst() -> list[UserInfo | None]:
        return await asyncio.gather(*(cache.lookup("bad", ledger.authenticate) for _ in range(20)))

    assert asyncio.run(burst()) == [None] * 20
    assert ledger.reads == 1
    # A key that failed is read again next time (it may have been created meanwhile).
    assert asyncio.run(cache.lookup("bad", ledger.authenticate)) is None
    assert ledger.reads == 2


def test_an_expired_entry_is_read_again() -> None:
    ledger = SlowLedger()
    cache = AuthenticationCache(ttl=0.01)
    assert asyncio.run(cache.lookup("good", ledger.authenticate)) == ALICE
    time.sleep(0.02)
    assert asyncio.run(cache.lookup("good", ledger.authenticate)) == ALICE
    assert ledger.reads == 2
