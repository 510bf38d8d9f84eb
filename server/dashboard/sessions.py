"""Dashboard sessions: an API key exchanged once for an opaque, expiring cookie token.

The store lives in the server's memory and keeps only the SHA-256 of each token, so neither a
token nor the key it was exchanged for can be read back from it. A restart signs everyone out.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

COOKIE_NAME = "inference_auction_session"
DEFAULT_TTL_SECONDS = 8 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    """Who signed in, and when the session ends (monotonic clock)."""

    user: str
    expires_at: float


class SessionStore:
    """Tokens of signed-in users; each expires `ttl` seconds after sign-in."""

    def __init__(
        self, ttl: float = DEFAULT_TTL_SECONDS, size: int = 10_000, per_user: int = 32
    ) -> None:
        self.ttl = ttl
        self._size = size
        self._per_user = per_user
        self._sessions: dict[str, Session] = {}

    def create(self, user: str) -> str:
        """A new session token for `user`."""
        now = time.monotonic()
        # One user signing in over and over must not crowd out everyone else's sessions.
        own = [d for d, s in self._sessions.items() if s.user == user]
        if len(own) >= self._per_user:
            self._drop_oldest(own)
        if len(self._sessions) >= self._size:
            self._sessions = {d: s for d, s in self._sessions.items() if s.expires_at > now}
            if len(self._sessions) >= self._size:  # still full: the oldest sign-in goes
                self._drop_oldest(list(self._sessions))
        token = secrets.token_urlsafe(32)
        self._sessions[_digest(token)] = Session(user=user, expires_at=now + self.ttl)
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

    def _drop_oldest(self, digests: list[str]) -> None:
        del self._sessions[min(digests, key=lambda d: self._sessions[d].expires_at)]

    def __len__(self) -> int:
        return len(self._sessions)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
