"""The API-key cache: a burst of requests for one key whose entry expired makes one read."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime

import pytest

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


@pytest.mark.anyio
async def test_concurrent_misses_share_one_read_and_the_answer_is_cached() -> None:
    ledger = SlowLedger()
    cache = AuthenticationCache(ttl=60)

    lookups = (cache.lookup("good", ledger.authenticate) for _ in range(50))
    assert await asyncio.gather(*lookups) == [ALICE] * 50
    assert ledger.reads == 1
    assert await cache.lookup("good", ledger.authenticate) == ALICE
    assert ledger.reads == 1  # cached


@pytest.mark.anyio
async def test_an_unknown_key_is_shared_but_not_cached() -> None:
    ledger = SlowLedger()
    cache = AuthenticationCache(ttl=60)

    lookups = (cache.lookup("bad", ledger.authenticate) for _ in range(20))
    assert await asyncio.gather(*lookups) == [None] * 20
    assert ledger.reads == 1
    # A key that failed is read again next time (it may have been created meanwhile).
    assert await cache.lookup("bad", ledger.authenticate) is None
    assert ledger.reads == 2


@pytest.mark.anyio
async def test_an_expired_entry_is_read_again() -> None:
    ledger = SlowLedger()
    now = [1000.0]
    cache = AuthenticationCache(ttl=2.0, clock=lambda: now[0])
    assert await cache.lookup("good", ledger.authenticate) == ALICE
    now[0] += 2.0  # at the end of its time to live, it is still good
    assert await cache.lookup("good", ledger.authenticate) == ALICE
    assert ledger.reads == 1
    now[0] += 0.001
    assert await cache.lookup("good", ledger.authenticate) == ALICE
    assert ledger.reads == 2
