"""Each user's budget of server time for one kind of costly read.

A count of requests (the per-key rate limit) does not bound what reads cost: a read of a second
at 200 a second is 200 times the server. Here each user has a bucket of `burst` seconds of
computing time, refilled at `rate` seconds per second; a read is refused with 429 (and
`Retry-After`) while its user's bucket is empty, and the time it took is taken from the bucket
once it ran. So a flood of costly reads costs its own user's budget, not the other users'
latency.
"""

from __future__ import annotations

from inference_auctions.server.errors import RateLimited

__all__ = ["CostBudget"]

# Users whose buckets are full again are forgotten once this many are remembered.
_REMEMBERED = 10_000


class CostBudget:
    """The buckets of the module docstring; `what` names the read in the 429's message."""

    def __init__(self, what: str, burst: float, rate: float, advice: str = "") -> None:
        self._what = what
        self._burst = burst
        self._rate = rate
        self._advice = advice
        self._left: dict[str, tuple[float, float]] = {}  # user -> (seconds left, as of)

    def check(self, user: str, now: float) -> None:
        """Raise `RateLimited` if `user` has spent its budget (`now`: `time.monotonic()`)."""
        left = self._refilled(user, now)
        if left > 0:
            return
        wait = max(1, round(-left / self._rate + 0.5))
        advice = f" ({self._advice})" if self._advice else ""
        raise RateLimited(
            f"{self._what}: this key has used its share of the server's time for them; "
            f"retry in {wait} s{advice}",
            headers={"Retry-After": str(wait)},
        )

    def spend(self, user: str, now: float, seconds: float) -> None:
        """Take `seconds` of computing time from `user`'s bucket."""
        self._left[user] = (self._refilled(user, now) - seconds, now)
        if len(self._left) > _REMEMBERED:
            full = [u for u in self._left if self._refilled(u, now) >= self._burst]
            for name in full:
                del self._left[name]

    def _refilled(self, user: str, now: float) -> float:
        left, as_of = self._left.get(user, (self._burst, now))
        return min(self._burst, left + (now - as_of) * self._rate)
