"""Request dependencies: the caller's identity (API key), rate limits, the app's services."""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from inference_auctions.billing import Ledger, UserInfo
from inference_auctions.server.api.bearer import bearer_key
from inference_auctions.server.api.market_prices import MarketPrices
from inference_auctions.server.api.user_limits import UserRateLimits, remember
from inference_auctions.server.cluster.rule_agreement import RuleAgreement
from inference_auctions.server.dashboard.snapshot import DashboardState
from inference_auctions.server.errors import Forbidden, RateLimited, Unauthenticated
from inference_auctions.server.request_context import bind_user
from inference_auctions.server.serving.service import AuctionService
from inference_auctions.server.settings import ServerSettings


class RateLimiter:
    """A token bucket per user: `rate` requests a second sustained, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}

    def check(self, user: str) -> None:
        """Take one token for `user`, or raise `RateLimited` with the seconds to wait."""
        now = time.monotonic()
        tokens, last = self._buckets.get(user, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens < 1:
            self._buckets[user] = (tokens, now)
            wait = math.ceil((1 - tokens) / self._rate)
            raise RateLimited(
                f"rate limit of {self._rate:g} requests/s exceeded; retry in {wait} s",
                headers={"Retry-After": str(wait)},
            )
        self._buckets[user] = (tokens - 1, now)


class AuthenticationCache:
    """Recently authenticated keys, so a busy client costs no database read per request.

    Keyed by the SHA-256 of the key (the key itself is never kept). A disabled user or a
    rotated key takes effect within `ttl` seconds. When an entry expires under load, the
    requests of that key arriving together share one database read instead of each making
    its own (a busy key has dozens in flight).
    """

    def __init__(
        self, ttl: float = 2.0, size: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._size = size
        self._clock = clock  # seconds, of any origin
        self._entries: dict[str, tuple[float, UserInfo]] = {}
        self._reading: dict[str, asyncio.Future[UserInfo | None]] = {}

    async def lookup(self, key: str, read: Callable[[str], UserInfo | None]) -> UserInfo | None:
        """The user of `key`: cached, or read by `read` (in a worker thread) once for every
        concurrent caller."""
        cached = self.get(key)
        if cached is not None:
            return cached
        digest = _digest(key)
        pending = self._reading.get(digest)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(read, key))
            self._reading[digest] = pending
            pending.add_done_callback(lambda _: self._reading.pop(digest, None))
        # Shielded: one caller giving up must not cancel the read the others wait on.
        user = await asyncio.shield(pending)
        if user is not None:
            self.put(key, user)
        return user

    def get(self, key: str) -> UserInfo | None:
        """The user of `key` if it was authenticated less than `ttl` seconds ago."""
        entry = self._entries.get(_digest(key))
        if entry is None or entry[0] < self._clock():
            return None
        return entry[1]

    def put(self, key: str, user: UserInfo) -> None:
        """Remember that `key` belongs to `user`."""
        if len(self._entries) >= self._size:
            self._entries.clear()  # crude but bounded; a full cache only costs reads
        self._entries[_digest(key)] = (self._clock() + self._ttl, user)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class AppState:
    """What the routes need, stored on `app.state.services`."""

    settings: ServerSettings
    service: AuctionService
    ledger: Ledger
    limiter: RateLimiter
    keys: AuthenticationCache
    market_prices: MarketPrices
    # This process's heartbeat in the ledger: its pricing rule, and a write on a schedule.
    agreement: RuleAgreement
    dashboard: DashboardState = field(default_factory=DashboardState)
    user_limits: UserRateLimits = field(default_factory=UserRateLimits)


def _app_state(request: Request) -> AppState:
    state: AppState = request.app.state.services
    return state


async def get_state(request: Request) -> AppState:
    """The app's services (a coroutine: FastAPI runs a plain function in a worker thread)."""
    return _app_state(request)


State = Annotated[AppState, Depends(get_state)]


async def current_user(request: Request, state: State) -> UserInfo:
    """The user whose `Authorization: Bearer <key>` this is; 401/403/429 otherwise."""
    key = bearer_key(request.headers.get("authorization", ""))
    if key is None:
        raise Unauthenticated(
            "send your API key as 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # A cached key (almost every request) needs no coroutine of the cache's.
    user = state.keys.get(key) or await state.keys.lookup(key, state.ledger.authenticate)
    if user is None:
        raise Unauthenticated("the API key is not valid", headers={"WWW-Authenticate": "Bearer"})
    bind_user(user.name)  # on this request's log lines (`server.request_context`)
    if user.disabled:
        raise Forbidden(f"user {user.name!r} is disabled")
    state.limiter.check(user.name)
    remember(request.scope, state.user_limits.take_request(user))
    return user


CurrentUser = Annotated[UserInfo, Depends(current_user)]


async def authenticated(request: Request) -> tuple[AppState, UserInfo]:
    """The app's services and the caller, as `State` and `CurrentUser` give them, without
    FastAPI's dependency resolution: the generation routes are the hot path, and resolving
    their dependencies cost about a tenth of the server's CPU per request."""
    state = _app_state(request)
    return state, await current_user(request, state)


async def admin_user(user: CurrentUser) -> UserInfo:
    """The caller, who must hold an admin key."""
    if not user.is_admin:
        raise Forbidden("this endpoint needs an admin API key")
    return user


AdminUser = Annotated[UserInfo, Depends(admin_user)]
