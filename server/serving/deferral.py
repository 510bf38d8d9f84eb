"""In-step prefix deferral: hold back a request whose prefix an earlier one is still computing.

SGLang's FCFS scheduler (the one priority scheduling uses) admits several waiting requests into
one prefill step without letting them share each other's new tokens: a prompt enters the radix
cache only when its step ends. An auction order puts a subtree's requests side by side, so one
step would admit them together and each would compute their shared prefix. The rule:

    A request is held back while it shares at least `threshold_tokens` prompt tokens, beyond
    what its batch has already computed, with an earlier request of its batch (in the
    auction's order) that has not produced its first token yet. It is released, to be sent
    with the priority it already has, when that request's first token arrives (or it ends),
    or after `max_hold_seconds`, whichever comes first.

Everything comes from the radix tree the auction built (`AuctionOutcome.radix_tree`): two
requests share the tokens down to their lowest common radix node, and "already computed" is
the deepest node on a request's path that a request with a first token passed through. No
prompt is compared again. The rule changes only when a request is handed to the engine, never
the order or the payments.

`PrefixDeferral` is pure (time is an argument, nothing is awaited): the server's dispatcher
(`server.serving.dispatch`) and the experiment runner
(`inference_auctions.experiments.runner`) drive the same object, so experiments and server cannot
drift apart.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from inference_auctions.server.auction import AuctionOutcome
from inference_auctions.server.auction.batch import NOT_A_REQUEST, RadixTree

__all__ = [
    "DEFAULT_MAX_HOLD_SECONDS",
    "DEFAULT_THRESHOLD_TOKENS",
    "BatchPrefixes",
    "DeferralSettings",
    "PrefixDeferral",
    "Release",
]

Key = TypeVar("Key", bound=Hashable)

DEFAULT_THRESHOLD_TOKENS = 32
DEFAULT_MAX_HOLD_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class DeferralSettings:
    """The rule's knobs: shared uncached tokens that trigger a hold, and the longest hold."""

    threshold_tokens: int = DEFAULT_THRESHOLD_TOKENS
    max_hold_seconds: float = DEFAULT_MAX_HOLD_SECONDS

    def __post_init__(self) -> None:
        if self.threshold_tokens < 1:
            raise ValueError(f"threshold_tokens must be >= 1, got {self.threshold_tokens}")
        if not self.max_hold_seconds >= 0:
            raise ValueError(f"max_hold_seconds must be >= 0, got {self.max_hold_seconds}")


@dataclass(frozen=True, slots=True)
class BatchPrefixes:
    """A batch's radix paths, by place in the service order.

    `paths[k]` lists the radix nodes (root excluded) from the root down to where the k-th
    request's prompt ends; `depth[node]` is the prompt tokens from the root to that node's end.
    """

    paths: list[list[int]]
    depth: list[int]

    @property
    def size(self) -> int:
        """Requests in the batch."""
        return len(self.paths)

    @classmethod
    def from_tree(cls, tree: RadixTree, service_order: Sequence[int]) -> BatchPrefixes:
        """The paths of the tree's requests (by request index) in `service_order`."""
        path_to: list[list[int]] = [[] for _ in tree.parent]
        for node in tree.preorder[1:]:  # parents first
            if tree.request[node] == NOT_A_REQUEST:
                path_to[node] = [*path_to[tree.parent[node]], node]
        paths = [path_to[tree.parent[tree.leaf_of[index]]] for index in service_order]
        return cls(paths=paths, depth=tree.depth_tokens)

    @classmethod
    def from_outcome(cls, outcome: AuctionOutcome) -> BatchPrefixes:
        """The paths of a cleared batch, in the auction's order (its `order`)."""
        if not outcome.order:
            return cls(paths=[], depth=[0])
        if outcome.radix_tree is None:
            raise ValueError("the auction outcome carries no radix tree")
        index = {rid: i for i, rid in enumerate(outcome.arrival_order)}
        return cls.from_tree(outcome.radix_tree, [index[rid] for rid in outcome.order])


@dataclass(frozen=True, slots=True)
class Release(Generic[Key]):
    """A held request let go: how long it was held, and the prompt tokens it no longer computes.

    `saved_tokens` is how much deeper its batch's computed prefix reaches on its path than when
    it was held: what a step shared with its blocker would have computed twice.
    """

    key: Key
    held_seconds: float
    saved_tokens: int
    expired: bool


class _Batch:
    """The state of one batch: which requests have a first token, and what is computed."""

    __slots__ = ("computed", "finished", "members", "open", "prefixes", "seen", "sequence")

    def __init__(self, sequence: int, prefixes: BatchPrefixes) -> None:
        self.sequence = sequence
        self.prefixes = prefixes
        size = len(prefixes.depth)
        self.computed = [False] * size
        self.finished = [False] * prefixes.size
        self.open = prefixes.size
        # Per node, the places of the requests through it, ascending (they are added in order),
        # and how many of the first have finished: the earliest unfinished is members[seen].
        self.members: list[list[int]] = [[] for _ in range(size)]
        self.seen = [0] * size
        for place, path in enumerate(prefixes.paths):
            for node in path:
                self.members[node].append(place)

    def cached(self, place: int) -> int:
        """Prompt tokens of this request that its batch has already computed."""
        for node in reversed(self.prefixes.paths[place]):
            if self.computed[node]:
                return self.prefixes.depth[node]
        return 0

    def blocker(self, place: int, threshold: int) -> int | None:
        """The earliest unfinished earlier request sharing >= threshold uncached tokens."""
        depth = self.prefixes.depth
        need = self.cached(place) + threshold
        for node in self.prefixes.paths[place]:
            # The shallowest node deep enough: every request sharing enough passes through it.
            if depth[node] >= need:
                earliest = self._earliest_unfinished(node)
                return earliest if earliest < place else None
        return None

    def _earliest_unfinished(self, node: int) -> int:
        members, seen = self.members[node], self.seen[node]
        while self.finished[members[seen]]:  # the request itself is unfinished: no overrun
            seen += 1
        self.seen[node] = seen
        return members[seen]

    def finish(self, place: int, computed: bool) -> None:
        self.finished[place] = True
        self.open -= 1
        if computed:
            for node in reversed(self.prefixes.paths[place]):
                if self.computed[node]:
                    break  # its ancestors were marked with it
                self.computed[node] = True


@dataclass(frozen=True, slots=True)
class _Hold:
    since: float
    cached: int  # prompt tokens its batch had computed when it was held


class PrefixDeferral(Generic[Key]):
    """Decides which requests of the cleared batches to hold back, and when to let them go.

    Keys identify requests across batches (a ledger rid, a query index). `add_batch` returns
    the keys to send now; `first_token`, `ended` and `expire` return the `Release`s to send
    then, in service order. Times are seconds on any monotonic clock.
    """

    def __init__(self, settings: DeferralSettings | None = None) -> None:
        self.settings = settings or DeferralSettings()
        self._batches: dict[int, _Batch] = {}
        self._where: dict[Key, tuple[int, int]] = {}
        self._keys: dict[int, list[Key]] = {}
        self._holds: dict[Key, _Hold] = {}
        # The places held on each (batch, place): looked at again when that request finishes.
        self._waiting: dict[tuple[int, int], list[int]] = {}
        self._deadlines: list[tuple[float, int, int, Key]] = []
        self._sequence = 0

    @property
    def holding(self) -> int:
        """Requests held back right now."""
        return len(self._holds)

    def add_batch(self, prefixes: BatchPrefixes, keys: Sequence[Key], now: float) -> list[Key]:
        """Take a cleared batch (`keys` in service order); returns the keys to send now."""
        if len(keys) != prefixes.size:
            raise ValueError(f"{len(keys)} keys for a batch of {prefixes.size} requests")
        known = [key for key in keys if key in self._where]
        if known or len(set(keys)) != len(keys):
            raise ValueError(f"request {(known or keys)[0]!r} is already in a batch")
        sequence = self._sequence
        self._sequence += 1
        batch = _Batch(sequence, prefixes)
        self._batches[sequence] = batch
        self._keys[sequence] = list(keys)
        send: list[Key] = []
        for place, key in enumerate(keys):
            self._where[key] = (sequence, place)
            if not self._hold_if_blocked(batch, place, key, now, None):
                send.append(key)
        if batch.open == 0:
            self._drop(sequence)
        return send

    def first_token(self, key: Key, now: float) -> list[Release[Key]]:
        """`key` produced its first token: its prompt is now in the engine's cache."""
        return self._finish(key, now, computed=True)

    def ended(self, key: Key, now: float) -> list[Release[Key]]:
        """`key` ended without a first token (failed, cancelled): stop waiting for it."""
        return self._finish(key, now, computed=False)

    def next_deadline(self) -> float | None:
        """When the earliest hold runs out; None when nothing is held."""
        while self._deadlines and not self._live(self._deadlines[0]):
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def expire(self, now: float) -> list[Release[Key]]:
        """Let go of every request held for `max_hold_seconds` by `now`."""
        released: list[tuple[int, int, Release[Key]]] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            entry = heapq.heappop(self._deadlines)
            _, sequence, place, key = entry
            if self._live(entry):
                released.append((sequence, place, self._release(key, now, expired=True)))
        released.sort(key=lambda item: item[:2])
        return [release for _, _, release in released]

    def _live(self, entry: tuple[float, int, int, Key]) -> bool:
        # A deadline outlives its hold when the request was released or ended first.
        _, sequence, place, key = entry
        return key in self._holds and self._where.get(key) == (sequence, place)

    def _finish(self, key: Key, now: float, *, computed: bool) -> list[Release[Key]]:
        where = self._where.get(key)
        if where is None:
            return []  # not deferred by this rule, or already finished
        sequence, place = where
        batch = self._batches[sequence]
        released: list[Release[Key]] = []
        if key in self._holds:
            # Ended while still held back (cancelled): it will never be sent.
            del self._holds[key]
        batch.finish(place, computed)
        del self._where[key]
        waiting = self._waiting.pop((sequence, place), [])
        keys = self._keys[sequence]
        for other in sorted(waiting):
            other_key = keys[other]
            hold = self._holds.get(other_key)
            if hold is None:
                continue
            if not self._hold_if_blocked(batch, other, other_key, now, hold):
                released.append(self._release(other_key, now, expired=False))
        if batch.open == 0:
            self._drop(sequence)
        return released

    def _hold_if_blocked(
        self, batch: _Batch, place: int, key: Key, now: float, hold: _Hold | None
    ) -> bool:
        blocker = batch.blocker(place, self.settings.threshold_tokens)
        if blocker is None:
            return False
        if hold is None:
            deadline = now + self.settings.max_hold_seconds
            if not math.isfinite(deadline):
                raise ValueError("max_hold_seconds must be finite")
            if deadline <= now:
                return False  # a zero wait holds nothing
            self._holds[key] = _Hold(now, batch.cached(place))
            heapq.heappush(self._deadlines, (deadline, batch.sequence, place, key))
        self._waiting.setdefault((batch.sequence, blocker), []).append(place)
        return True

    def _release(self, key: Key, now: float, *, expired: bool) -> Release[Key]:
        hold = self._holds.pop(key)
        sequence, place = self._where[key]
        saved = self._batches[sequence].cached(place) - hold.cached
        return Release(key, now - hold.since, saved, expired)

    def _drop(self, sequence: int) -> None:
        del self._batches[sequence]
        del self._keys[sequence]
