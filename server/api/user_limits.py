"""Each user's own rate limits: requests and tokens per minute, over a rolling minute.

A limit is a user's setting in the ledger (`users limits`, `PUT /v1/admin/users/{name}/limits`)
and reaches a replica with the user's identity, so a change applies within the authentication
cache's two seconds. Each replica counts its own traffic: behind N replicas a user can reach N
times its limit (the server-wide limit, `RateLimiter`, is shared out the same way).

Every authenticated request counts toward requests per minute. A generation counts its prompt
tokens plus the most it may generate (`max_tokens`), when it is admitted, as OpenAI counts
them, so a burst of long requests is refused before it reaches the engine. A refusal is a 429
with `Retry-After` and OpenAI's `x-ratelimit-*` headers; an answer to a user with limits carries
the same `x-ratelimit-*` headers (`RequestIdMiddleware` adds what `remember` left in the
request's scope).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import Scope

from inference_auctions.billing import UserInfo
from inference_auctions.server.errors import InvalidRequest, RateLimited

WINDOW_SECONDS = 60.0
# Where the headers of a request's answer wait in its ASGI scope's state.
SCOPE_KEY = "ratelimit_headers"
_NONE: dict[str, str] = {}


def remember(scope: Scope, headers: dict[str, str]) -> None:
    """Keep `headers` for the answer to the request of `scope` (nothing when empty)."""
    if headers:
        scope.setdefault("state", {})[SCOPE_KEY] = [
            (name.encode(), value.encode()) for name, value in headers.items()
        ]


@dataclass
class _Window:
    """What one user did in the last minute: request times, and (time, tokens) pairs."""

    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    token_total: int = 0

    def expire(self, now: float) -> None:
        horizon = now - WINDOW_SECONDS
        while self.requests and self.requests[0] <= horizon:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= horizon:
            self.token_total -= self.tokens.popleft()[1]


def reset_text(seconds: float) -> str:
    """A wait as OpenAI writes it in `x-ratelimit-reset-*`: `120ms`, `1.5s`, `1m0s`."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class UserRateLimits:
    """The rolling minute of every user with a limit of its own, on this replica."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def _window(self, name: str, now: float) -> _Window:
        window = self._windows.setdefault(name, _Window())
        window.expire(now)
        return window

    def take_request(self, user: UserInfo) -> dict[str, str]:
        """Count one request of `user`, or raise `RateLimited` when its minute is full; the
        `x-ratelimit-*` headers of the answer."""
        rpm, tpm = user.requests_per_minute, user.tokens_per_minute
        if rpm is None and tpm is None:
            return _NONE  # nearly every user: nothing to count
        now = self._clock()
        window = self._window(user.name, now)
        if rpm is not None and len(window.requests) >= rpm:
            # The oldest request leaving the window makes room for one more.
            wait = window.requests[0] + WINDOW_SECONDS - now
            raise RateLimited(
                f"user {user.name!r} may send {rpm} requests per minute; retry in"
                f" {math.ceil(wait)} s",
                headers=self._headers(user, window, now, wait),
            )
        if tpm is not None and window.token_total >= tpm:
            wait = self._wait_for_tokens(window, tpm, 1, now)
            raise RateLimited(
                f"user {user.name!r} used its {tpm:,} tokens per minute; retry in"
                f" {math.ceil(wait)} s",
                headers=self._headers(user, window, now, wait),
            )
        window.requests.append(now)
        return self._headers(user, window, now)

    def take_tokens(self, user: UserInfo, tokens: int, field_name: str) -> dict[str, str]:
        """Count a generation's `tokens` (prompt plus the most it may generate), or refuse it:
        a 429 while the minute has too few left, a 400 when it needs more than a minute
        holds. The `x-ratelimit-*` headers of the answer."""
        tpm = user.tokens_per_minute
        if tpm is None:
            return _NONE
        if tokens > tpm:
            raise InvalidRequest(
                f"{field_name}: this request counts {tokens:,} tokens (prompt plus the most it"
                f" may generate), more than user {user.name!r} may use in a minute ({tpm:,});"
                " send a shorter prompt or a lower limit",
                param=field_name,
            )
        now = self._clock()
        window = self._window(user.name, now)
        if window.token_total + tokens > tpm:
            wait = self._wait_for_tokens(window, tpm, tokens, now)
            if window.requests:
                window.requests.pop()  # this request was refused: it takes no request slot
            raise RateLimited(
                f"user {user.name!r} may use {tpm:,} tokens per minute and has"
                f" {tpm - window.token_total:,} left; this request counts {tokens:,} (prompt"
                f" plus the most it may generate); retry in {math.ceil(wait)} s",
                headers=self._headers(user, window, now, wait),
            )
        window.tokens.append((now, tokens))
        window.token_total += tokens
        return self._headers(user, window, now)

    @staticmethod
    def _wait_for_tokens(window: _Window, tpm: int, tokens: int, now: float) -> float:
        """Seconds until `tokens` more fit under `tpm`, as the oldest counts leave."""
        total = window.token_total
        for at, counted in window.tokens:
            total -= counted
            if total + tokens <= tpm:
                return at + WINDOW_SECONDS - now
        return WINDOW_SECONDS

    @staticmethod
    def _headers(
        user: UserInfo, window: _Window, now: float, wait: float | None = None
    ) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` for the limits the user has, and on a refusal (`wait`
        seconds) `Retry-After`."""
        headers = {} if wait is None else {"Retry-After": str(max(1, math.ceil(wait)))}
        rpm, tpm = user.requests_per_minute, user.tokens_per_minute
        if rpm is not None:
            # Reset: when the window is empty again, the newest request having left it.
            newest = window.requests[-1] if window.requests else now - WINDOW_SECONDS
            headers["x-ratelimit-limit-requests"] = str(rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, rpm - len(window.requests)))
            headers["x-ratelimit-reset-requests"] = reset_text(
                max(0.0, newest + WINDOW_SECONDS - now)
            )
        if tpm is not None:
            newest = window.tokens[-1][0] if window.tokens else now - WINDOW_SECONDS
            headers["x-ratelimit-limit-tokens"] = str(tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, tpm - window.token_total))
            headers["x-ratelimit-reset-tokens"] = reset_text(
                max(0.0, newest + WINDOW_SECONDS - now)
            )
        return headers
