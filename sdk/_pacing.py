"""Value pacing by dual descent (Algorithm 3 of the paper) with a never-overspend guard.

Each request's value `v` (what full priority is worth, in micro-credits) becomes the bid
`floor(v / (1 + mu))`. After every auction the user took part in, with charge `z` and target
spend per auction `gamma`, the dual variable moves as `mu <- clip(mu + eta * (z - gamma), 0,
mu_max)`: spending above target shades later bids down, spending below target lifts them back
towards the full value. Separately from pacing, bids are scaled down whenever their sum plus
everything already in flight would exceed what is left of the budget; since a VCG charge never
exceeds the bids it answers, the charges can then never add up to more than the budget. A
server's request fee (paid by every request, zero bids included, on top of its charge) counts
as spend and is reserved with each bid: bids are scaled down to leave room for the fees, and a
request whose fee alone the budget cannot cover is not sent (`BudgetExhaustedError`).

Several processes of one user share one budget through the server's ledger: a client hands the
user's ledger-wide spend, auction count and open holds to `sync_shared` at a bounded interval,
and adds the charges it sees itself in between, so that every process derives the same target.
The holds of the other processes (bids they have in flight, each of which may still be charged
in full) count against what this process may bid until the next sync: without them, every
process near the end of a plan bid what was left at once, and the plan was overspent by up to
one remainder per process.

A bidder that joins a plan already in progress (a restart, or one more process of the user) has
learned nothing, but the plan has: `mu = 0` would open with full-value bids while the others
pace, and one such burst can spend a large part of the plan in seconds. It starts instead with
an exponential search for the multiplier ("slow start"): `alpha = gamma / value` (a bid of the
target itself, whose charge cannot exceed it), doubled after every auction that leaves the
search's spend below the sum of its auctions' targets plus one more, and handed to the dual
descent as `mu = 1 / alpha - 1` at the first auction that brings it there, or when alpha
reaches 1. The search is held to its cumulative target rather than to one auction's because
charges are heavy-tailed and mostly zero at low multipliers: one high value early in the search
would otherwise stop it far too low, and the descent climbs out of a low multiplier slowly (a
charge of 0 moves mu by at most `eta * gamma`), while it comes down from a high one fast. A
bidder that starts a fresh plan (nothing spent, no auction counted) starts at `mu = 0` as before.

This module does no I/O and never blocks for long, so the same object serves threads and
asyncio tasks alike: every method takes one short lock and returns.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ._budget import Budget, default_anchor, period_window
from ._exceptions import BudgetExhaustedError, ConfigurationError

__all__ = ["PacingBidder", "SyncMarker"]

STATE_VERSION = 1
# Charges of older batches are forgotten: a batch is reported within one request's lifetime.
_MAX_BATCHES = 4096
_STATE_BATCHES = 256
# Over the last part of a period the multiplier alpha rises linearly to 1: budget left at the
# end is worth nothing, so bidding closer to full value then only adds utility (the guard
# still caps bids).
_FINAL_STRETCH = 0.1


class SyncMarker(NamedTuple):
    """What a process had counted when it sent a shared sync (`sync_marker`)."""

    spent: int
    auctions: int
    reserved: int


@dataclass
class _Batch:
    charge: int
    rids: set[str] = field(default_factory=set)


class PacingBidder:
    """Turns values into bids under a `Budget`, learning the pacing multiplier as it goes."""

    def __init__(
        self,
        budget: Budget,
        *,
        clock: Callable[[], float] = time.time,
        server_period: bool = False,
    ) -> None:
        self._budget = budget
        # Paced against the user's budget period on the server, whose length and grant come
        # from there; `budget` then only carries the pacing options.
        self._server_period = server_period
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._mu = 0.0
        self._spent = 0
        self._reserved = 0
        self._auctions = 0
        self._v_max = 0
        self._guarded = False
        # The server's request fee (micro-credits per request), learned at each ledger sync
        # and from every cleared request.
        self._fee = 0
        self._batches: OrderedDict[str, _Batch] = OrderedDict()
        # The auction rate is measured over the whole life of the bidder, across periods.
        self._rate_auctions = 0
        self._rate_seconds_before = 0.0
        self._rate_since = now
        self._version = 0
        # The budget being paced: the Budget's total, or the server period's grant once synced.
        self._total = budget.total_micros
        # Set by `sync_shared`: spend, auctions and the period come from the server's ledger,
        # shared by every process of the user; between syncs this process adds what it sees.
        self._shared = False
        self._shared_elapsed = 0.0
        self._shared_at = now
        self._local_spent = 0
        self._local_auctions = 0
        # Bids the user's other processes had in flight (held by the server) at the last sync.
        self._others_held = 0
        # Charges seen while the last sync was under way: maybe in its figure, maybe not.
        self._unconfirmed = 0
        self._needs_sync = False
        # Nothing learned yet (no auction observed, no state restored): a first shared sync
        # showing a plan in progress then starts the slow start.
        self._fresh = True
        # The slow start's multiplier while it runs, else None; 0.0 until the first bid sets it.
        self._probe: float | None = None
        # The multiplier each slow-start bid went out at, by amount: with requests in flight
        # concurrently, a charge must move the search from the multiplier that earned it, or
        # every settlement of one round would double it again.
        # Equal amounts queue up, oldest first.
        self._probe_bids: OrderedDict[int, list[float]] = OrderedDict()
        # What the search has spent, and what its auctions were due (the sum of their targets).
        self._probe_spent = 0
        self._probe_due = 0.0
        self._start = budget.start or _utc(now)
        self._window: tuple[datetime, datetime] | None = None
        if budget.period is not None:
            anchor = budget.start or default_anchor(budget.period, _utc(now))
            self._window = period_window(budget.period, anchor, _utc(now))

    # -- reading the state -------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        """The budget being paced."""
        return self._budget

    @property
    def mu(self) -> float:
        """The dual variable; 0 means bidding full value (`1 / alpha - 1` in the slow start)."""
        return self._current_mu()

    @property
    def alpha(self) -> float:
        """The pacing multiplier `1 / (1 + mu)` applied to values."""
        return 1.0 / (1.0 + self._current_mu())

    @property
    def slow_start(self) -> bool:
        """Whether the bidder is still searching for its multiplier after joining a plan."""
        return self._probe is not None

    @property
    def spent_micros(self) -> int:
        """Charges observed in the current horizon or period."""
        return self._spent

    @property
    def in_flight_micros(self) -> int:
        """Sum of bids (and their request fees) sent whose outcome is not known yet."""
        return self._reserved

    @property
    def request_fee_micros(self) -> int:
        """The server's request fee, as last learned (0: none, or not learned yet)."""
        return self._fee

    def set_request_fee(self, fee_micros: int) -> None:
        """Take the server's request fee (from a ledger sync or a cleared request)."""
        if fee_micros < 0:
            raise ValueError("the request fee must not be negative")
        with self._lock:
            self._fee = fee_micros

    @property
    def others_in_flight_micros(self) -> int:
        """Bids the user's other processes had held by the server at the last shared sync."""
        return self._others_held

    @property
    def remaining_micros(self) -> int:
        """Budget not yet spent in the current horizon or period."""
        with self._lock:
            self._roll(self._clock())
            return max(0, self._total - self._spent)

    @property
    def available_micros(self) -> int:
        """What new bids may still add up to: the remaining budget less the bids in flight
        (this process's, and the other processes' held at the last shared sync)."""
        with self._lock:
            self._roll(self._clock())
            return self._available()

    @property
    def auctions(self) -> int:
        """Distinct auctions (batches) observed in the current horizon or period."""
        return self._auctions

    @property
    def total_micros(self) -> int:
        """The budget of the current horizon or period (the server's grant when paced by it)."""
        return self._total

    @property
    def budget_limited(self) -> bool:
        """Whether the budget currently holds bids below the values (or is spent)."""
        return self._current_mu() > 0.0 or self._guarded or self.exhausted

    @property
    def exhausted(self) -> bool:
        """Whether the budget of the current horizon or period is spent.

        Charges counted twice for safety (seen while a sync was under way) do not make it
        so: only spend the ledger confirmed, plus charges seen since.
        """
        with self._lock:
            self._roll(self._clock())
            confirmed = self._spent - self._unconfirmed
            # With a fee, a budget that cannot pay it is spent: no request is free any more.
            return confirmed >= self._total or confirmed + self._fee > self._total

    @property
    def needs_sync(self) -> bool:
        """Whether a new period began since the last shared sync, so its figures are stale."""
        return self._needs_sync

    @property
    def target_micros(self) -> float:
        """The target spend per auction, `gamma`."""
        with self._lock:
            return self._gamma(self._clock())

    @property
    def window(self) -> tuple[datetime, datetime] | None:
        """The current period `[start, end)` for periodic budgets, else None."""
        with self._lock:
            self._roll(self._clock())
            return self._window

    @property
    def spend_since(self) -> datetime:
        """Since when charges count against the budget (the horizon or period start)."""
        with self._lock:
            self._roll(self._clock())
            return self._window[0] if self._window is not None else self._start

    @property
    def charges(self) -> dict[str, int]:
        """Charges per batch id for the batches remembered in this horizon or period."""
        with self._lock:
            return {batch_id: b.charge for batch_id, b in self._batches.items()}

    @property
    def version(self) -> int:
        """A counter bumped by every change, so writers of the state file can skip stale ones."""
        return self._version

    # -- bidding and settling ----------------------------------------------------------------

    def bid(self, values: Sequence[int], *, max_bid: int | None = None) -> list[int]:
        """Bids in micro-credits for one auction's values; their sum and the requests' fees
        are reserved as in flight. Raises `BudgetExhaustedError` when what is available cannot
        pay the fees alone (nothing is reserved then)."""
        if any(v < 0 for v in values):
            raise ValueError("values must not be negative")
        with self._locked() as now:
            fees = self._fee * len(values)
            if fees > self._available():
                raise BudgetExhaustedError(
                    f"the request fee of {fees} micro-credits is more than the"
                    f" {self._available()} available (budget less spend and bids in flight);"
                    " nothing was sent",
                    spent_micros=self._spent,
                    total_micros=self._total,
                )
            self._v_max = max(self._v_max, sum(values))
            if self._budget.pacing != "asap" and self._probe == 0.0 and sum(values) > 0:
                # The slow start's first bid: the target itself, whose charge (never above
                # the bid) cannot overshoot it.
                self._probe = min(1.0, self._gamma(now) / sum(values))
            mu = self._bid_mu(sum(values), now)
            bids, self._guarded = self._guard(self._capped(values, mu, max_bid), fees)
            if self._probe:
                # Settled by the reserved amount, which is how the charge finds its multiplier.
                self._probe_bids.setdefault(sum(bids) + fees, []).append(1.0 / (1.0 + mu))
                while len(self._probe_bids) > _STATE_BATCHES:
                    self._probe_bids.popitem(last=False)
            self._reserved += sum(bids) + fees
            return bids

    def preview(self, value: int, *, max_bid: int | None = None) -> int:
        """The bid `bid([value])` would send now, without reserving it or learning from it
        (0 when what is available cannot pay the request fee)."""
        if value < 0:
            raise ValueError("values must not be negative")
        with self._lock:
            now = self._clock()
            self._roll(now)
            (bid,), _ = self._guard(
                self._capped([value], self._bid_mu(value, now), max_bid), self._fee
            )
            return max(0, bid)

    def reserve(self, amount: int) -> int:
        """Reserve up to `amount` of the available budget for a bid placed elsewhere."""
        with self._locked():
            granted = max(0, min(amount, self._available()))
            self._reserved += granted
            return granted

    def release(self, amount: int) -> None:
        """Return a reservation whose request was never charged."""
        with self._locked():
            self._reserved = max(0, self._reserved - amount)

    def settle(
        self,
        batch_id: str,
        charge_micros: int,
        *,
        reserved: int,
        rid: str = "",
        per_request: bool = False,
    ) -> bool:
        """Release a request's reservation and record its charge, in one step.

        `charge_micros` is the user's whole batch charge, or with `per_request` this request's
        share of it (the shares are added up). Returns True when this was the first report of
        the batch, i.e. the update ran.
        """
        with self._locked() as now:
            # Releasing and recording together: a gap between them would let a concurrent
            # bid see the money as available before the charge is counted.
            self._reserved = max(0, self._reserved - reserved)
            level = self._probe_level(reserved)
            return self._observe(batch_id, charge_micros, rid, now, per_request, level)

    def observe(
        self, batch_id: str, charge_micros: int, *, rid: str = "", per_request: bool = False
    ) -> bool:
        """Record a batch's total charge (or a request's share); one dual update per batch."""
        with self._locked() as now:
            return self._observe(batch_id, charge_micros, rid, now, per_request)

    def settle_unknown(self, reserved: int) -> None:
        """Count a reservation as spent when it is unknown whether the server charged it."""
        with self._locked():
            # Assuming the whole bid was charged keeps the guard sound; the next ledger sync
            # replaces the guess with the real figure.
            self._reserved = max(0, self._reserved - reserved)
            self._spent += reserved
            self._local_spent += reserved

    def refund(self, batch_id: str, rid: str) -> int:
        """Undo a batch's charge once its last known request failed at the engine."""
        with self._locked():
            record = self._batches.get(batch_id)
            if record is None:
                return 0
            record.rids.discard(rid)
            if record.rids:
                # Other requests of the batch succeeded; the server refunds only this one's
                # share, which only the ledger knows. Keeping the charge errs on the safe side.
                return 0
            amount = record.charge
            record.charge = 0
            self._spent = max(0, self._spent - amount)
            self._local_spent -= amount
            return amount

    def sync(
        self,
        spent_micros: int,
        *,
        period_start: datetime | None = None,
        batches: Mapping[str, int] | None = None,
    ) -> None:
        """Replace the spend with the server ledger's figure for the same horizon or period."""
        with self._locked() as now:
            if period_start is not None and isinstance(self._budget.period, str):
                self._window = period_window(self._budget.period, period_start, _utc(now))
            self._spent = spent_micros
            for batch_id, charge in (batches or {}).items():
                # Known to the ledger already: a later report must not add it a second time.
                self._batches.setdefault(batch_id, _Batch(charge))
            self._trim()

    def sync_marker(self) -> SyncMarker:
        """What this process had counted when a shared sync was sent (pass it back to it)."""
        with self._lock:
            return SyncMarker(self._local_spent, self._local_auctions, self._reserved)

    def sync_shared(
        self,
        *,
        marker: SyncMarker,
        spent_micros: int,
        auctions: int,
        window: tuple[datetime, datetime | None],
        now: datetime,
        total_micros: int | None = None,
        held_micros: int = 0,
    ) -> None:
        """Take the user's ledger-wide figures (every process of the user) as the spend.

        `window` is the horizon or period `[start, end)` the figures cover (end None for a
        horizon of auctions); `marker` is `sync_marker()` from just before the request, so
        charges this process saw while it was under way are added rather than lost. Counting
        them may count them twice until the next sync: an overestimate, the safe side.
        `held_micros` is the user's open holds on the server: less this process's own bids in
        flight (at the marker and now, the smaller), what the others may still be charged.
        """
        spent_before, auctions_before, reserved_before = marker
        with self._locked() as clock_now:
            start, end = window
            if end is not None:
                self._window = (start, end)
            elif self._window is None:
                self._start = start
            if total_micros is not None:
                self._total = total_micros
            joining = not self._shared and self._fresh and (spent_micros > 0 or auctions > 0)
            if joining and self._budget.pacing != "asap":
                self._probe = 0.0
            self._shared = True
            self._needs_sync = False
            self._unconfirmed = max(0, self._local_spent - spent_before)
            self._spent = spent_micros + self._unconfirmed
            self._auctions = auctions + (self._local_auctions - auctions_before)
            # How long the figures have been accruing, on the server's clock.
            self._shared_elapsed = max(0.0, (now - start).total_seconds())
            self._shared_at = clock_now
            # This process's own holds in the figure were in flight both at the marker and
            # now, or came and went between: taking the smaller of the two leaves more of the
            # figure to the others, the safe side (a bid of this process placed and held while
            # the read was under way counts twice until the next sync).
            own = min(reserved_before, self._reserved)
            self._others_held = max(0, held_micros - own)

    # -- persistence -------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """A JSON-ready snapshot from which `from_state` restores the bidder."""
        with self._lock:
            now = self._clock()
            recent = list(self._batches.items())[-_STATE_BATCHES:]
            return {
                "version": STATE_VERSION,
                "budget_micros": self._budget.total_micros,
                "auctions_horizon": self._budget.auctions,
                "mu": self._current_mu(),
                "spent_micros": self._spent,
                "auctions": self._auctions,
                "v_max_micros": self._v_max,
                "start": self._start.isoformat(),
                "window_start": None if self._window is None else self._window[0].isoformat(),
                "rate_auctions": self._rate_auctions,
                "rate_seconds": self._rate_seconds_before + (now - self._rate_since),
                "batches": {batch_id: b.charge for batch_id, b in recent},
            }

    @classmethod
    def from_state(
        cls,
        budget: Budget,
        state: Mapping[str, Any],
        *,
        clock: Callable[[], float] = time.time,
        server_period: bool = False,
    ) -> PacingBidder:
        """Restore a bidder; spend carries over only while the horizon or period is the same."""
        if state.get("version") != STATE_VERSION:
            raise ConfigurationError(f"unsupported pacing state version {state.get('version')!r}")
        bidder = cls(budget, clock=clock, server_period=server_period)
        try:
            bidder._restore(state)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"invalid pacing state: {exc}") from exc
        return bidder

    def _restore(self, state: Mapping[str, Any]) -> None:
        now = _utc(self._clock())
        self._fresh = False  # the multiplier comes from the state: nothing to search for
        self._mu = max(0.0, float(state["mu"]))
        self._v_max = int(state["v_max_micros"])
        self._rate_auctions = int(state["rate_auctions"])
        self._rate_seconds_before = float(state["rate_seconds"])
        same_budget = state["budget_micros"] == self._budget.total_micros
        if self._budget.period is None:
            same = same_budget and state["auctions_horizon"] == self._budget.auctions
            if same and self._budget.start is None:
                self._start = datetime.fromisoformat(state["start"])
        else:
            window_start = state["window_start"]
            same = same_budget and window_start is not None
            if same:
                anchor = datetime.fromisoformat(window_start)
                if self._budget.start is None:
                    self._window = period_window(self._budget.period, anchor, now)
                same = self._window is not None and self._window[0] == anchor
        if same:
            self._spent = int(state["spent_micros"])
            self._auctions = int(state["auctions"])
            for batch_id, charge in dict(state["batches"]).items():
                self._batches[str(batch_id)] = _Batch(int(charge))

    # -- internals (the lock is held) --------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[float]:
        with self._lock:
            now = self._clock()
            self._roll(now)
            yield now
            self._version += 1

    def _fade(self, now: float) -> float:
        """1 until the final stretch of a period, then down to 0 at its end: the weight left
        on the learned shading `1 - alpha`."""
        if self._window is None:
            return 1.0
        start, end = self._window
        stretch = _FINAL_STRETCH * (end - start).total_seconds()
        return min(1.0, max(0.0, end.timestamp() - now) / stretch)

    def _available(self) -> int:
        return max(0, self._total - self._spent - self._reserved - self._others_held)

    def _bid_mu(self, total_value: int, now: float) -> float:
        """The dual variable a bid for values summing to `total_value` goes out at now."""
        if self._budget.pacing == "asap":
            return 0.0
        probe = self._probe
        if probe == 0.0 and total_value > 0:
            probe = min(1.0, self._gamma(now) / total_value)  # what the first bid will set
        mu = 1.0 / probe - 1.0 if probe else self._mu
        fade = self._fade(now)
        # The multiplier alpha, not mu, goes linearly to 1 over the final stretch:
        # `alpha' = 1 - (1 - alpha) * fade`, i.e. the `mu` below. Scaling mu instead leaves a
        # large mu (a small target late in a plan) shading bids almost to the end, when the
        # last of the budget is still to be spent.
        return mu * fade / (1.0 + mu * (1.0 - fade))

    def _capped(self, values: Sequence[int], mu: float, max_bid: int | None) -> list[int]:
        bids = [_scale(v, mu) for v in values]
        for cap in (self._budget.max_bid_micros, max_bid):
            if cap is not None:
                bids = [min(b, cap) for b in bids]
        return bids

    def _guard(self, bids: list[int], fees: int = 0) -> tuple[list[int], bool]:
        """The bids scaled down to what is available, and whether that cut them."""
        # The fees are paid whatever the bids: what is left after them caps the bids.
        available = max(0, self._available() - fees)
        total = sum(bids)
        if total <= available:
            return bids, False
        # Scaling each bid by available/total (rounded down) keeps the sum within reach.
        return [b * available // total for b in bids], True

    def _observe(
        self,
        batch_id: str,
        charge: int,
        rid: str,
        now: float,
        per_request: bool = False,
        level: float | None = None,
    ) -> bool:
        if charge < 0:
            raise ValueError("a charge cannot be negative")
        record = self._batches.get(batch_id)
        if record is not None:
            if per_request:
                # Each request reports its own share: the shares add up to the batch charge.
                if rid not in record.rids:
                    record.rids.add(rid)
                    record.charge += charge
                    self._spent += charge
                    self._local_spent += charge
                return False
            # Another of our requests in the same batch: the charge covers them all, so it is
            # counted once; a different figure replaces the first without a second update.
            if rid:
                record.rids.add(rid)
            self._spent += charge - record.charge
            self._local_spent += charge - record.charge
            record.charge = charge
            return False
        self._batches[batch_id] = _Batch(charge, {rid} if rid else set())
        self._trim()
        self._spent += charge
        self._local_spent += charge
        self._local_auctions += 1
        self._fresh = False
        self._auctions += 1
        self._rate_auctions += 1
        self._update(charge, now, level)
        return True

    def _update(self, charge: int, now: float, level: float | None = None) -> None:
        if self._budget.pacing == "asap" or self._spent >= self._total:
            # Nothing left to pace: the guard holds bids at zero until the budget renews, and
            # the zero charges that follow say nothing about the right multiplier.
            return
        gamma = self._gamma(now)
        if self._probe is not None:
            self._search(charge, gamma, level)
            return
        eta = self._budget.eta0 / (gamma * math.sqrt(self._horizon(now)))
        mu_max = self._v_max / gamma
        self._mu = min(max(self._mu + eta * (charge - gamma), 0.0), mu_max)

    def _search(self, charge: int, gamma: float, level: float | None) -> None:
        """One step of the slow start: double alpha below target, else hand over to descent.

        `level` is the multiplier the charged bid went out at (the current one when unknown).
        """
        assert self._probe is not None
        if self._probe == 0.0:
            return  # no bid of ours set the first multiplier yet
        alpha = self._probe if level is None else level
        self._probe_spent += charge
        self._probe_due += gamma
        if self._probe_spent >= self._probe_due + gamma:
            # The first multiplier at which the search has spent what its auctions were due,
            # and the next one's too (so that one heavy charge early on, against a due of one
            # or two targets, does not stop it): the dual descent goes on from it.
            self._mu = min(max(1.0 / alpha - 1.0, 0.0), self._v_max / gamma)
            self._end_search()
        elif alpha * 2.0 >= 1.0:
            self._mu = 0.0  # full value still spends below target: nothing to shade
            self._end_search()
        else:
            self._probe = max(self._probe, alpha * 2.0)

    def _probe_level(self, reserved: int) -> float | None:
        """The multiplier a slow-start bid of `reserved` went out at, forgetting it."""
        levels = self._probe_bids.get(reserved)
        if not levels:
            return None
        level = levels.pop(0)
        if not levels:
            del self._probe_bids[reserved]
        return level

    def _end_search(self) -> None:
        self._probe = None
        self._probe_bids.clear()
        self._probe_spent = 0
        self._probe_due = 0.0

    def _current_mu(self) -> float:
        if self._probe:  # searching, with a multiplier set
            return 1.0 / self._probe - 1.0
        return self._mu

    def _gamma(self, now: float) -> float:
        if self._window is None:
            horizon = self._budget.auctions or 1
            if not self._shared:
                return self._total / horizon
            # Shared by processes (and restarts): what is left over the auctions left, from
            # the ledger-wide figures, so that a burst by one process is made up by all.
            remaining = max(0, self._total - self._spent)
            return max(1.0, remaining / max(1, horizon - self._auctions))
        remaining = max(0, self._total - self._spent)
        # At least one micro-credit, so that eta and mu_max stay finite at the very end.
        return max(1.0, remaining / self._expected_remaining(now))

    def _horizon(self, now: float) -> float:
        if self._window is None:
            return float(self._budget.auctions or 1)
        return self._auctions + self._expected_remaining(now)

    def _expected_remaining(self, now: float) -> float:
        """Auctions still to come in this period, from the rate seen so far."""
        assert self._window is not None
        start, end = self._window
        length = (end - start).total_seconds()
        time_left = max(0.0, end.timestamp() - now)
        if self._shared:
            # The user's rate over the whole period so far, every process together: each
            # process then derives the same target.
            seen = self._auctions
            elapsed = self._shared_elapsed + (now - self._shared_at)
        else:
            seen = self._rate_auctions
            elapsed = self._rate_seconds_before + (now - self._rate_since)
        # A pseudo-window of 1/24 of the period keeps the first few auctions from implying
        # an absurd rate; a declared `auctions` per period serves as the prior rate over it.
        pseudo = length / 24.0
        if self._budget.auctions is not None:
            prior = self._budget.auctions / length * pseudo
            rate = (seen + prior) / (elapsed + pseudo)
        else:
            rate = seen / max(elapsed, pseudo)
        return max(1.0, rate * time_left)

    def _roll(self, now: float) -> None:
        if self._window is None or now < self._window[1].timestamp():
            return
        if self._server_period or self._budget.period is None:
            # A server period: the next one's start and grant come with the next sync.
            length = self._window[1] - self._window[0]
            self._window = (self._window[1], self._window[1] + length)
            self._needs_sync = True
        else:
            self._window = period_window(self._budget.period, self._window[1], _utc(now))
            self._needs_sync = self._shared
        # A new period renews the budget; mu carries over, it is what was learned.
        self._spent = 0
        self._unconfirmed = 0
        self._others_held = 0
        self._auctions = 0
        self._shared_elapsed = 0.0
        self._shared_at = now
        self._batches.clear()
        self._version += 1

    def _trim(self) -> None:
        while len(self._batches) > _MAX_BATCHES:
            self._batches.popitem(last=False)


def _scale(value: int, mu: float) -> int:
    """`floor(value / (1 + mu))` exactly: a float is a ratio of integers."""
    num, den = mu.as_integer_ratio()
    return value * den // (den + num)


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)
