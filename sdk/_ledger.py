"""Read-only resources: the account's ledger (balance, entries, summaries, the budget period,
spend), the models served, and recent clearing prices."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import datetime
from typing import Literal, Protocol, TypeVar

from pydantic import BaseModel

from ._base_client import ledger_params
from ._constants import LEDGER_PAGE_SIZE
from ._models import (
    Balance,
    BudgetPeriod,
    LedgerEntry,
    LedgerPage,
    LedgerSummary,
    MarketPool,
    MarketPrices,
    MarketRule,
    ModelList,
    Spend,
    TierMenu,
)

__all__ = [
    "AsyncLedger",
    "AsyncMarket",
    "AsyncModels",
    "EntryKind",
    "Ledger",
    "Market",
    "Models",
    "SummaryPeriod",
]

EntryKind = Literal["grant", "hold", "release", "charge", "refund", "adjustment", "fee", "floor"]
SummaryPeriod = Literal["day", "week", "month"]


_M = TypeVar("_M", bound=BaseModel)


class _Getter(Protocol):
    def _get(self, path: str, params: Mapping[str, str | int], model: type[_M]) -> _M: ...


class _AsyncGetter(Protocol):
    async def _get(self, path: str, params: Mapping[str, str | int], model: type[_M]) -> _M: ...


class Ledger:
    """Read the ledger through a synchronous client."""

    def __init__(self, client: _Getter) -> None:
        self._client = client

    def balance(self) -> Balance:
        """Balance, holds, and spend in the server's current period."""
        return self._client._get("/v1/ledger/balance", {}, Balance)

    def budget(self) -> BudgetPeriod:
        """The budget period on the server: its start and end, the grant, spent, time left."""
        return self._client._get("/v1/budget", {}, BudgetPeriod)

    def spend(self, since: datetime | str) -> Spend:
        """Spend (charges net of refunds) and auctions since `since`, every process together."""
        return self._client._get("/v1/spend", ledger_params(since=since), Spend)

    def entries(
        self,
        *,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        kind: EntryKind | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> LedgerPage:
        """One page of ledger entries."""
        params = ledger_params(since=since, until=until, kind=kind, limit=limit, cursor=cursor)
        return self._client._get("/v1/ledger/entries", params, LedgerPage)

    def iter_entries(
        self,
        *,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        kind: EntryKind | None = None,
    ) -> Iterator[LedgerEntry]:
        """Every matching entry, fetching pages as needed."""
        cursor: str | None = None
        while True:
            page = self.entries(
                since=since, until=until, kind=kind, limit=LEDGER_PAGE_SIZE, cursor=cursor
            )
            yield from page.entries
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def summary(self, *, by: SummaryPeriod = "day") -> LedgerSummary:
        """Charges, refunds, grants and request counts per period."""
        return self._client._get("/v1/ledger/summary", {"by": by}, LedgerSummary)


class AsyncLedger:
    """Read the ledger through an asynchronous client."""

    def __init__(self, client: _AsyncGetter) -> None:
        self._client = client

    async def balance(self) -> Balance:
        """Balance, holds, and spend in the server's current period."""
        return await self._client._get("/v1/ledger/balance", {}, Balance)

    async def budget(self) -> BudgetPeriod:
        """The budget period on the server: its start and end, the grant, spent, time left."""
        return await self._client._get("/v1/budget", {}, BudgetPeriod)

    async def spend(self, since: datetime | str) -> Spend:
        """Spend (charges net of refunds) and auctions since `since`, every process together."""
        return await self._client._get("/v1/spend", ledger_params(since=since), Spend)

    async def entries(
        self,
        *,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        kind: EntryKind | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> LedgerPage:
        """One page of ledger entries."""
        params = ledger_params(since=since, until=until, kind=kind, limit=limit, cursor=cursor)
        return await self._client._get("/v1/ledger/entries", params, LedgerPage)

    async def iter_entries(
        self,
        *,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        kind: EntryKind | None = None,
    ) -> AsyncIterator[LedgerEntry]:
        """Every matching entry, fetching pages as needed."""
        cursor: str | None = None
        while True:
            page = await self.entries(
                since=since, until=until, kind=kind, limit=LEDGER_PAGE_SIZE, cursor=cursor
            )
            for entry in page.entries:
                yield entry
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def summary(self, *, by: SummaryPeriod = "day") -> LedgerSummary:
        """Charges, refunds, grants and request counts per period."""
        return await self._client._get("/v1/ledger/summary", {"by": by}, LedgerSummary)


class Models:
    """`GET /v1/models` through a synchronous client."""

    def __init__(self, client: _Getter) -> None:
        self._client = client

    def list(self) -> ModelList:
        """The models the server serves."""
        return self._client._get("/v1/models", {}, ModelList)


class AsyncModels:
    """`GET /v1/models` through an asynchronous client."""

    def __init__(self, client: _AsyncGetter) -> None:
        self._client = client

    async def list(self) -> ModelList:
        """The models the server serves."""
        return await self._client._get("/v1/models", {}, ModelList)


class Market:
    """Recent clearing prices through a synchronous client."""

    def __init__(self, client: _Getter) -> None:
        self._client = client

    def prices(self, *, window_seconds: int = 3600, max_batches: int = 1000) -> MarketPrices:
        """What places in the queue cost over the last `window_seconds` (all users' batches)."""
        params = {"window_seconds": window_seconds, "max_batches": max_batches}
        return self._client._get("/v1/market/prices", params, MarketPrices)

    def rule(self) -> MarketRule:
        """The pricing rule every batch is cleared under: its slots and the request fee."""
        return self._client._get("/v1/market/rule", {}, MarketRule)

    def tiers(self) -> TierMenu:
        """The tiers a `--pricing tiers` server sells, with what each recently bought."""
        return self._client._get("/v1/market/tiers", {}, TierMenu)

    def pool(self, *, bid: int | None = None) -> MarketPool:
        """The rolling auction's waiting pool now; with `bid` (micro-credits), how many
        entrants it would not overtake (404 on a server that does not publish it)."""
        return self._client._get("/v1/market/pool", ledger_params(bid=bid), MarketPool)


class AsyncMarket:
    """Recent clearing prices through an asynchronous client."""

    def __init__(self, client: _AsyncGetter) -> None:
        self._client = client

    async def prices(self, *, window_seconds: int = 3600, max_batches: int = 1000) -> MarketPrices:
        """What places in the queue cost over the last `window_seconds` (all users' batches)."""
        params = {"window_seconds": window_seconds, "max_batches": max_batches}
        return await self._client._get("/v1/market/prices", params, MarketPrices)

    async def rule(self) -> MarketRule:
        """The pricing rule every batch is cleared under: its slots and the request fee."""
        return await self._client._get("/v1/market/rule", {}, MarketRule)

    async def tiers(self) -> TierMenu:
        """The tiers a `--pricing tiers` server sells, with what each recently bought."""
        return await self._client._get("/v1/market/tiers", {}, TierMenu)

    async def pool(self, *, bid: int | None = None) -> MarketPool:
        """The rolling auction's waiting pool now; with `bid` (micro-credits), how many
        entrants it would not overtake (404 on a server that does not publish it)."""
        return await self._client._get("/v1/market/pool", ledger_params(bid=bid), MarketPool)
