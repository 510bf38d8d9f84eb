"""The server's hand-off to the engine, with in-step prefix deferral (`server.serving.deferral`).

`DeferredDispatch.dispatch` takes a cleared batch's engine requests in the auction's order,
sends at once those the rule lets go, and keeps the others until `first_token` or `ended` of
the request they wait for (the service calls both from its per-request stream), or until
their hold runs out on a timer. A released request keeps the priority the auction gave it, so
the engine still admits it before every request of a later place. With the rule off, or an
engine in `ordered` mode (which never admits two of a batch into one step), every request is
sent at once, exactly as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from inference_auctions.server.auction import AuctionOutcome
from inference_auctions.server.engine.base import Engine, EngineRequest
from inference_auctions.server.engine.generation import Generation
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving.deferral import (
    BatchPrefixes,
    DeferralSettings,
    PrefixDeferral,
    Release,
)

__all__ = ["DeferredDispatch", "Follow"]

# Called with each request's place in its batch and its generation once it is sent.
Follow = Callable[[int, Generation], None]


class DeferredDispatch:
    """Sends cleared batches to the engine, holding back what the rule says (see the docstring)."""

    def __init__(self, engine: Engine, settings: DeferralSettings | None, metrics: Metrics) -> None:
        self.engine = engine
        self.rule: PrefixDeferral[str] | None = (
            PrefixDeferral(settings) if settings is not None else None
        )
        self._metrics = metrics
        self._held: dict[str, tuple[EngineRequest, int, Follow]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    def dispatch(
        self, outcome: AuctionOutcome, requests: Sequence[EngineRequest], follow: Follow
    ) -> None:
        """Send a cleared batch (`requests` in `outcome.order`); `follow` each once it is sent."""
        if self.rule is None or len(requests) < 2:
            self._send([(request, place, follow) for place, request in enumerate(requests)])
            return
        now = asyncio.get_running_loop().time()
        # Keyed by the engine's rids (a request sent again has a rid of its own there).
        keys = [request.rid for request in requests]
        send = set(self.rule.add_batch(BatchPrefixes.from_outcome(outcome), keys, now))
        ready = []
        for place, request in enumerate(requests):
            if request.rid in send:
                ready.append((request, place, follow))
            else:
                self._held[request.rid] = (request, place, follow)
        self._metrics.deferral_held.inc(len(requests) - len(ready))
        self._send(ready)
        self._arm_timer()

    def first_token(self, rid: str) -> None:
        """`rid` produced its first token: release what waited for its prefix."""
        if self.rule is not None:
            self._release(self.rule.first_token(rid, asyncio.get_running_loop().time()))

    def ended(self, rid: str) -> None:
        """`rid` ended (a no-op after its first token): stop waiting for it."""
        if self.rule is not None:
            self._release(self.rule.ended(rid, asyncio.get_running_loop().time()))

    def withdraw(self, rids: Sequence[str]) -> None:
        """Forget `rids`: those still held back are never sent (their batch was cancelled)."""
        if self.rule is None:
            return
        now = asyncio.get_running_loop().time()
        for rid in rids:
            self._held.pop(rid, None)
        for rid in rids:
            # Anything this releases waited in the same batch, which is withdrawn whole.
            self.rule.ended(rid, now)

    def close(self) -> None:
        """Stop the hold timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None

    def _release(self, releases: list[Release[str]]) -> None:
        if not releases:
            return
        ready = []
        for release in releases:
            ready.append(self._held.pop(release.key))
            self._metrics.deferral_hold_seconds.observe(release.held_seconds)
            self._metrics.deferral_saved_tokens.inc(release.saved_tokens)
            if release.expired:
                self._metrics.deferral_expired.inc()
        self._send(ready)

    def _send(self, ready: list[tuple[EngineRequest, int, Follow]]) -> None:
        if not ready:
            return
        generations = self.engine.dispatch([request for request, _, _ in ready])
        for (_, place, follow), generation in zip(ready, generations, strict=True):
            follow(place, generation)

    def _arm_timer(self) -> None:
        assert self.rule is not None
        deadline = self.rule.next_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = asyncio.get_running_loop().call_at(deadline, self._expire)

    def _expire(self) -> None:
        assert self.rule is not None
        self._timer = self._timer_at = None
        self._release(self.rule.expire(asyncio.get_running_loop().time()))
        self._arm_timer()
