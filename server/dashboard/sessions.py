"""Dashboard sessions: an API key exchanged once for an opaque, expiring cookie token.

The store lives in the server's memory and keeps only the SHA-256 of each token, so neither a
token nor the key it was exchanged for can be read back from it. A restart signs everyone out.
A session remembers when it was signed in: one older than its user's `sessions_from` (the key
rotated, the user disabled, on any replica) is over (`server.api.dashboard_routes.viewer`).
When the store is full, the oldest session of the user holding the most goes, never an
operator's while others hold any: a flood of sign-ins cannot sign the operator out.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

COOKIE_NAME = "inference_auction_session"
DEFAULT_TTL_SECONDS = 8 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    """Who signed in, and when the session ends (monotonic clock)."""

    user: str
    expires_at: float
    admin: bool = False
    signed_in_at: datetime = field(default_factory=lambda: datetime.now(UTC))


class SessionStore:
    """Tokens of signed-in users; each expires `ttl` seconds after sign-in."""

    def __init__(
        self, ttl: float = DEFAULT_TTL_SECONDS, size: int = 10_000, per_user: int = 32
    ) -> None:
        self.ttl = ttl
        self._size = size
        self._per_user = per_user
        self._sessions: dict[str, Session] = {}

    def create(self, user: str, admin: bool = False) -> str:
        """A new session token for `user`."""
        now = time.monotonic()
        # One user signing in over and over must not crowd out everyone else's sessions.
        own = [d for d, s in self._sessions.items() if s.user == user]
        if len(own) >= self._per_user:
            self._drop_oldest(own)
        if len(self._sessions) >= self._size:
            self._sessions = {d: s for d, s in self._sessions.items() if s.expires_at > now}
            if len(self._sessions) >= self._size:  # still full: see the module docstring
                self._drop_oldest(self._crowding())
        token = secrets.token_urlsafe(32)
        self._sessions[_digest(token)] = Session(user=user, expires_at=now + self.ttl, admin=admin)
        return token

    def get(self, token: str) -> Session | None:
        """The live session of `token`, or None (unknown, ended or expired)."""
        digest = _digest(token)
        session = self._sessions.get(digest)
        if session is None:
            return None
        if session.expires_at <= time.monotonic():
            del self._sessions[digest]
            return None
        return session

    def end(self, token: str) -> None:
        """Sign the token's session out (nothing happens for an unknown token)."""
        self._sessions.pop(_digest(token), None)

    def _crowding(self) -> list[str]:
        """The sessions of the non-operator user holding the most (any user's if none)."""
        sessions = self._sessions
        counts = Counter(s.user for s in sessions.values() if not s.admin)
        if not counts:
            counts = Counter(s.user for s in sessions.values())
        most = counts.most_common(1)[0][0]
        return [d for d, s in sessions.items() if s.user == most]

    def _drop_oldest(self, digests: list[str]) -> None:
        del self._sessions[min(digests, key=lambda d: self._sessions[d].expires_at)]

    def __len__(self) -> int:
        return len(self._sessions)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
