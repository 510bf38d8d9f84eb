"""The `Ledger`: the service API that the server and the CLI call; nothing else touches SQL.

Every method is one short transaction. Users are named by their unique `name`; money is int
micro-credits. Methods that move money lock the affected balance rows first, so concurrent
callers (threads, processes, replicas) serialize per user and never overdraw. Write methods are
idempotent where the ledger has a natural key (request id, batch id, period), so a retry after
a lost reply does no harm. See `billing.grants` for what a periodic budget means.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from types import TracebackType
from typing import Self, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from inference_auctions.billing import (
    activity,
    audit,
    autovacuum,
    decoy_watch,
    grants,
    group_commit,
    holds,
    market,
    migrate,
    queries,
    reconcile,
    recovery,
    refunds,
    replica_rules,
    request_log,
    settlement,
    users,
)
from inference_auctions.billing import admin as _admin
from inference_auctions.billing.database import (
    READ_ONLY,
    create_ledger_engine,
    in_a_file,
    unavailable,
)
from inference_auctions.billing.driver_sql import watch_engine
from inference_auctions.billing.errors import (
    InvalidInput,
    LedgerError,
    RequestNotScheduled,
    UnknownRequest,
)
from inference_auctions.billing.export import render
from inference_auctions.billing.group_commit import ClaimFailed, GroupOutcome
from inference_auctions.billing.inputs import (
    BatchInput,
    CompletionInput,
    HoldInput,
    RequestInput,
    ServedInput,
)
from inference_auctions.billing.keys import ApiKeyView, IssuedKey
from inference_auctions.billing.models import EntryKind, RequestStatus
from inference_auctions.billing.periods import require_aware
from inference_auctions.billing.users import UNSET, _Unset
from inference_auctions.billing.views import (
    BalanceView,
    ClaimedBatch,
    CreatedUser,
    EntryPage,
    EntryView,
    HoldView,
    ReconcileView,
    RefundResult,
    RefundRule,
    RequestView,
    RolloverResult,
    SettleResult,
    SummaryView,
    UserInfo,
)
from inference_auctions.billing.wal_checkpoints import (
    BACKSTOP_PAGES,
    WalCheckpointer,
    checkpoints_apply,
)

T = TypeVar("T")

_ATTEMPTS = 3

logger = logging.getLogger(__name__)
# Unique violation (a concurrent insert of the same key), serialization failure, deadlock.
_RETRY_SQLSTATES = {"23505", "40001", "40P01"}


class _Attempt:
    """One attempt at a write transaction: which one (0 for the first), and whether it got as
    far as committing (a failure from then on may have committed, so the attempt is not run
    again)."""

    __slots__ = ("committing", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.committing = False


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _retryable(exc: DBAPIError | PoolTimeout) -> bool:
    # Only races between transactions are retried; a failed CHECK is a bug and propagates.
    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _RETRY_SQLSTATES:
        return True
    return isinstance(exc, IntegrityError) and "UNIQUE constraint failed" in str(orig)


def _lost_before_commit(exc: DBAPIError | PoolTimeout, committing: bool) -> bool:
    """Whether the transaction failed on a connection found dead before it tried to commit;
    if so, says so in one WARNING line (the transaction then runs again on a new one)."""
    lost = not committing and isinstance(exc, DBAPIError) and exc.connection_invalidated
    if lost:
        # The driver's first line only: the rest may quote statements and values.
        why = str(getattr(exc, "orig", exc)).strip().splitlines()[0:1] or ["no reason given"]
        logger.warning(
            "a ledger connection was closed by the database (%s): replaced by a new one, "
            "and its transaction runs again there",
            why[0],
        )
    return lost


class Ledger:
    """Budgets, holds, charges and refunds of the auction's users, in one SQL database."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], datetime] = _utc_now,
        owns_engine: bool = False,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._owns_engine = owns_engine
        self._checkpointer: WalCheckpointer | None = None  # `from_url(checkpoint_in_background)`
        # A lone `served` record is one statement, committed by itself (`_serve_one`).
        self._autocommit_engine: Engine | None = None
        if engine.dialect.name == "postgresql":
            watch_engine(engine)  # group commits send their writes together, before the COMMIT
            self._autocommit_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        read_options: dict[str, object] = {READ_ONLY: True}
        if engine.dialect.name == "postgresql":
            # Reads of several rows should agree with each other, as of one snapshot.
            read_options["isolation_level"] = "REPEATABLE READ"
        self._read_engine = engine.execution_options(**read_options)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        clock: Callable[[], datetime] = _utc_now,
        checkpoint_in_background: bool = False,
        sqlite_busy_timeout: float | None = None,
        pool_size: int | None = None,
        max_overflow: int | None = None,
    ) -> Self:
        """A ledger on a new engine for `url`; `close()` disposes of the engine. With
        `checkpoint_in_background`, a SQLite file's WAL is checkpointed by a thread of its
        own, not by the connections that commit (`billing.wal_checkpoints`); a server's ledger,
        whose commits requests wait on. `sqlite_busy_timeout`: see `create_ledger_engine`.
        `pool_size`, `max_overflow`: the connection pool's (SQLAlchemy's 5 and 10 where None)."""
        pool = {
            key: value
            for key, value in (("pool_size", pool_size), ("max_overflow", max_overflow))
            if value is not None
        }
        if not checkpoint_in_background:
            engine = create_ledger_engine(url, sqlite_busy_timeout=sqlite_busy_timeout, **pool)
            return cls(engine, clock=clock, owns_engine=True)
        engine = create_ledger_engine(
            url,
            wal_autocheckpoint=BACKSTOP_PAGES,
            sqlite_busy_timeout=sqlite_busy_timeout,
            **pool,
        )
        ledger = cls(engine, clock=clock, owns_engine=True)
        if checkpoints_apply(engine):
            ledger._checkpointer = WalCheckpointer(engine).start()
        return ledger

    @property
    def engine(self) -> Engine:
        """The engine the ledger writes through: for billing itself, its tests and tools; the
        server asks what it needs as plain facts (`dialect_name`)."""
        return self._engine

    @property
    def dialect_name(self) -> str:
        """The kind of database: `sqlite` or `postgresql`."""
        return str(self._engine.dialect.name)

    @property
    def in_memory(self) -> bool:
        """Whether the database lives in this process's memory (SQLite in memory), where no
        other process can open it."""
        return self._engine.dialect.name == "sqlite" and not in_a_file(self._engine)

    def close(self) -> None:
        """Stop its WAL checkpoints, if it runs them; dispose of the engine if the ledger
        created it."""
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._owns_engine:
            self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _now(self) -> datetime:
        return require_aware(self._clock(), "clock")

    # Down, locked past the busy timeout or out of connections: the transaction did not commit,
    # so the caller may retry. Callers see the ledger's `LedgerUnavailable`, never SQLAlchemy's.
    # A pooled connection found dead before the commit (the database restarted, a proxy
    # dropped it while idle) committed nothing either: the work runs once more on a fresh one.
    # That is what makes checking each connection on checkout (`pool_pre_ping`, a round trip
    # per transaction) unnecessary.

    def _write(self, work: Callable[[Session], T]) -> T:
        def once(attempt: _Attempt) -> T:
            with Session(self._engine, expire_on_commit=False) as session:
                with session.begin():
                    result = work(session)
                    attempt.committing = True  # what fails from here on may have committed
                return result

        return self._retrying(once)

    def _write_statements(self, work: Callable[[Connection], T]) -> T:
        """`_write` for work of driver statements alone (`billing.driver_sql`), on a plain
        connection's transaction: no ORM session around it, which would cost more than a
        statement on SQLite."""

        def once(attempt: _Attempt) -> T:
            with self._engine.connect() as connection, connection.begin():
                result = work(connection)
                attempt.committing = True
            return result

        return self._retrying(once)

    @staticmethod
    def _retrying(once: Callable[[_Attempt], T]) -> T:
        for number in range(_ATTEMPTS):
            attempt = _Attempt(number)
            try:
                return once(attempt)
            except (OperationalError, PoolTimeout) as exc:
                last = number == _ATTEMPTS - 1
                if last or not (_retryable(exc) or _lost_before_commit(exc, attempt.committing)):
                    raise unavailable(exc) from exc
            except DBAPIError as exc:
                last = number == _ATTEMPTS - 1
                if last or not (_retryable(exc) or _lost_before_commit(exc, attempt.committing)):
                    raise
        raise AssertionError("unreachable")

    def _serve_one(self, record: ServedInput, now: datetime) -> bool:
        """`record_served_many([record])`: one statement. On SQLite in a transaction without an
        ORM session (`_write_statements`). On PostgreSQL in autocommit mode: no BEGIN and no
        COMMIT, one round trip where a transaction takes three; it is all or nothing by
        itself. A connection lost after the statement was sent leaves unknown whether it
        committed, so such an attempt is never marked committing (it runs again) and the
        attempt after it asks (`request_log.serve_one`)."""
        request_log.check_served(record)
        autocommit = self._autocommit_engine
        if autocommit is None:  # SQLite: in process, no connection is lost midway
            return self._write_statements(lambda c: request_log.serve_one(c, record, now))

        def once(attempt: _Attempt) -> bool:
            with autocommit.connect() as connection:
                return request_log.serve_one(connection, record, now, again=attempt.number > 0)

        return self._retrying(once)

    def _read(self, work: Callable[[Session], T]) -> T:
        for attempt in range(_ATTEMPTS):
            try:
                with Session(self._read_engine) as session, session.begin():
                    return work(session)
            except (OperationalError, PoolTimeout) as exc:
                if attempt == _ATTEMPTS - 1 or not _lost_before_commit(exc, committing=False):
                    raise unavailable(exc) from exc
        raise AssertionError("unreachable")

    # Users and budgets. Every change is recorded with `actor`, who made it (`audit`).

    def create_user(
        self,
        name: str,
        *,
        budget_micros: int,
        period: str = "none",
        timezone: str = "UTC",
        batch_cap_micros: int | None = None,
        admin: bool = False,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        actor: str = audit.LIBRARY_ACTOR,
    ) -> CreatedUser:
        """Create a user and grant its first period; the API key is in the result, once."""
        now = self._now()
        return self._write(
            lambda s: _admin.create_user(
                s,
                name,
                budget_micros=budget_micros,
                period=period,
                timezone=timezone,
                batch_cap_micros=batch_cap_micros,
                admin=admin,
                requests_per_minute=requests_per_minute,
                tokens_per_minute=tokens_per_minute,
                actor=actor,
                now=now,
            )
        )

    def authenticate(self, api_key: str) -> UserInfo | None:
        """The user holding `api_key` (unrevoked, unexpired), or None; check `disabled` on
        the result."""
        now = self._now()
        return self._read(lambda s: users.authenticate(s, api_key, now))

    def get_user(self, name: str) -> UserInfo:
        """The user named `name`; raises `UnknownUser`."""
        return self._read(lambda s: users.get_user_info(s, name))

    def list_users(self) -> list[UserInfo]:
        """All users, by name."""
        return self._read(users.list_users)

    def disable_user(self, name: str, *, actor: str = audit.LIBRARY_ACTOR) -> UserInfo:
        """Refuse the user's new holds; holds already placed settle normally. Idempotent."""
        now = self._now()
        return self._write(lambda s: _admin.set_disabled(s, name, True, actor=actor, now=now))

    def enable_user(self, name: str, *, actor: str = audit.LIBRARY_ACTOR) -> UserInfo:
        """Undo `disable_user`. Idempotent."""
        now = self._now()
        return self._write(lambda s: _admin.set_disabled(s, name, False, actor=actor, now=now))

    def rotate_api_key(self, name: str, *, actor: str = audit.LIBRARY_ACTOR) -> str:
        """Revoke every key of the user and give it a new one named `default` (returned
        once)."""
        now = self._now()
        return self._write(lambda s: _admin.rotate_api_key(s, name, actor=actor, now=now))

    def create_api_key(
        self,
        name: str,
        key_name: str,
        *,
        expires_at: datetime | None = None,
        actor: str = audit.LIBRARY_ACTOR,
    ) -> IssuedKey:
        """Give the user another key named `key_name`, working until `expires_at` (None:
        until revoked); the key is in the result, once."""
        now = self._now()
        return self._write(
            lambda s: _admin.create_api_key(
                s, name, key_name, expires_at=expires_at, actor=actor, now=now
            )
        )

    def revoke_api_key(
        self, name: str, key_name: str, *, actor: str = audit.LIBRARY_ACTOR
    ) -> ApiKeyView:
        """Revoke the user's key named `key_name`; raises `UnknownApiKey`."""
        now = self._now()
        return self._write(lambda s: _admin.revoke_api_key(s, name, key_name, actor=actor, now=now))

    def api_keys(self, name: str, *, revoked: bool = False) -> list[ApiKeyView]:
        """The user's keys, oldest first (the revoked ones too if `revoked`)."""
        return self._read(lambda s: _admin.list_api_keys(s, name, revoked=revoked))

    def set_rate_limits(
        self,
        name: str,
        *,
        requests_per_minute: int | _Unset | None = UNSET,
        tokens_per_minute: int | _Unset | None = UNSET,
        actor: str = audit.LIBRARY_ACTOR,
    ) -> UserInfo:
        """Set the user's own rate limits (None: none of its own; not given: unchanged)."""
        now = self._now()
        return self._write(
            lambda s: _admin.set_limits(
                s,
                name,
                requests_per_minute=requests_per_minute,
                tokens_per_minute=tokens_per_minute,
                actor=actor,
                now=now,
            )
        )

    def admin_actions(
        self, *, user: str | None = None, after_id: int = 0, limit: int = 100
    ) -> list[audit.AdminActionView]:
        """Recorded administrative actions after `after_id`, oldest first (of `user` only,
        if given)."""
        return self._read(
            lambda s: audit.list_actions(s, user=user, after_id=after_id, limit=limit)
        )

    def set_budget(
        self,
        name: str,
        *,
        budget_micros: int | None = None,
        period: str | None = None,
        timezone: str | None = None,
        batch_cap_micros: int | _Unset | None = UNSET,
        actor: str = audit.LIBRARY_ACTOR,
    ) -> UserInfo:
        """Change the given budget fields (None: unchanged; a cap of None: no cap).

        The batch cap changes at once; amount, period and time zone at the next boundary of
        the schedule in force (`pending_*` in the result), a lifetime amount at once.
        """
        now = self._now()
        return self._write(
            lambda s: _admin.set_budget(
                s,
                name,
                budget_micros=budget_micros,
                period=period,
                timezone=timezone,
                batch_cap_micros=batch_cap_micros,
                actor=actor,
                now=now,
            )
        )

    # Grants and corrections

    def grant(
        self,
        name: str,
        period_start: datetime,
        amount_micros: int,
        *,
        reason: str | None = None,
        actor: str = audit.LIBRARY_ACTOR,
    ) -> EntryView:
        """Grant more to the current period, the one containing `period_start`; once per user
        and period. A period that has ended or not started is refused (`InvalidInput`)."""
        now = self._now()
        return self._write(
            lambda s: _admin.grant(
                s, name, period_start, amount_micros, reason=reason, actor=actor, now=now
            )
        )

    def adjust(
        self,
        name: str,
        amount_micros: int,
        *,
        reason: str,
        key: str | None = None,
        actor: str = audit.LIBRARY_ACTOR,
    ) -> EntryView:
        """Correct a balance by a signed amount; idempotent under `key` (default: a new one)."""
        now = self._now()
        key = key if key is not None else uuid.uuid4().hex
        return self._write(
            lambda s: _admin.adjust(
                s, name, amount_micros, reason=reason, key=key, actor=actor, now=now
            )
        )

    def rollover(self, now: datetime | None = None) -> RolloverResult:
        """Open the current budget period of every enabled user not yet in it; idempotent.

        Every money operation opens its user's period itself; this only does it for idle users.
        """
        moment = self._now() if now is None else require_aware(now, "now")
        due = self._read(lambda s: grants.due_for_rollover(s, moment))
        # One transaction per user keeps each lock short; each re-checks under its lock.
        granted = [
            name
            for name in due
            if self._write(partial(grants.rollover_user, name=name, now=moment))
        ]
        return RolloverResult(granted=granted)

    # Holds

    def place_hold(
        self, name: str, rid: str, amount_micros: int, fingerprint: str | None = None
    ) -> HoldView:
        """Hold `amount_micros` for request `rid`; raises `InsufficientFunds`. Idempotent; a
        released hold is opened again by a replay with the same payload `fingerprint`."""
        result = self.place_holds([HoldInput(name, rid, amount_micros, fingerprint)])[0]
        if isinstance(result, LedgerError):
            raise result
        return result

    def place_holds(self, requests: Sequence[HoldInput]) -> list[HoldView | LedgerError]:
        """Place many holds in one transaction (group commit); result i is what `place_hold`
        would have returned for `requests[i]`, or the `LedgerError` it would have raised, had
        the requests been placed one after the other in this order. A refused request changes
        nothing for the others; raises `LedgerUnavailable` (nothing written) as a whole."""
        if not requests:
            return []
        now = self._now()
        return self._write(lambda s: holds.place_holds(s, requests, now))

    def commit_group(
        self,
        requests: Sequence[HoldInput],
        records: Sequence[ServedInput],
        claims: Sequence[settlement.BatchClaim] = (),
    ) -> GroupOutcome:
        """What a group-commit writer collected since its last commit, in ONE transaction
        (`billing.group_commit`): `place_holds(requests)`, then each batch of `claims`
        claimed, cleared and settled (`settle_claimable`), then
        `record_served_many(records)`.

        A claim that fails (an invalid batch, a bug in its clearing) gets its error as its
        result and the group runs again without it, so nothing of it is written; no
        savepoint per claim, which would cost two more round trips to the database on every
        commit. A database failure fails the whole group (`LedgerUnavailable`, nothing
        written). A group of one served record and nothing else (the common case of a lone
        request) is one statement, committed by itself (`_serve_one`). A constraint that
        only the database checks (a batch id settled before), or a value it refuses, fails
        when the deferred writes reach it, at the commit, where it cannot tell which claim
        it was: the group then runs again with each claim's writes sent as it makes them,
        so that the failing claim is found and left out alone."""
        if not requests and not records and not claims:
            return GroupOutcome([], [], [])
        now = self._now()
        if not requests and not claims:  # served records only: see `record_served_many`
            return GroupOutcome([], self._record_served(records, now), [])
        failed: dict[int, Exception] = {}
        defer = True
        while True:
            work = partial(
                group_commit.commit_group,
                requests=requests,
                records=records,
                claims=claims,
                now=now,
                failed=failed,
                defer=defer,
            )
            try:
                return self._write(work)
            except ClaimFailed as failure:  # rolled back: again, without that claim
                failed[failure.index] = failure.error
            except DBAPIError:  # a constraint or a value the database refused (not a loss)
                if not defer:
                    raise
                defer = False

    def release(self, rid: str, reason: str = "dropped before dispatch") -> HoldView:
        """Release the hold of a request that will not be settled. Idempotent."""
        now = self._now()
        return self._write(lambda s: holds.release(s, rid, reason, now))

    def expire_holds(
        self, now: datetime | None = None, max_age: timedelta = timedelta(hours=1)
    ) -> int:
        """Release open holds older than `max_age`; returns how many. Idempotent."""
        moment = self._now() if now is None else require_aware(now, "now")
        if not isinstance(max_age, timedelta) or max_age <= timedelta(0):
            raise InvalidInput("max_age", f"must be a positive timedelta, got {max_age!r}")
        stale = self._read(lambda s: holds.stale_holds(s, moment - max_age))
        return sum(
            self._write(
                partial(holds.expire_user_holds, name=name, rids=rids, max_age=max_age, now=moment)
            )
            for name, rids in stale.items()
        )

    # Batches

    def settle_batch(
        self,
        batch: BatchInput,
        requests: Sequence[RequestInput],
        charges: Mapping[str, int],
    ) -> SettleResult:
        """Record a cleared batch, charge its users and release its holds, atomically."""
        now = self._now()
        return self._write(lambda s: settlement.settle_batch(s, batch, requests, charges, now))

    def refund(
        self,
        batch_id: str,
        name: str,
        reason: str,
        amount_micros: int | None = None,
        *,
        rid: str | None = None,
    ) -> RefundResult:
        """Refund (part of) the user's charge in the batch; never more than was charged."""
        now = self._now()
        return self._write(
            lambda s: refunds.refund(
                s, batch_id, name, reason=reason, amount_micros=amount_micros, rid=rid, now=now
            )
        )

    def complete_request(
        self,
        rid: str,
        status: str,
        cached_tokens: int | None = None,
        ttft_ms: float | None = None,
    ) -> RequestView:
        """Overwrite a settled request's outcome (an operator's correction; moves no money)."""
        now = self._now()
        return self._write(
            lambda s: request_log.complete_request(
                s, rid, status=status, cached_tokens=cached_tokens, ttft_ms=ttft_ms, now=now
            )
        )

    def complete_requests(self, completions: Sequence[CompletionInput]) -> list[RequestView]:
        """Overwrite several requests' outcomes in one transaction (all or none)."""
        now = self._now()
        return self._write(
            lambda s: [
                request_log.complete_request(
                    s,
                    c.rid,
                    status=c.status,
                    cached_tokens=c.cached_tokens,
                    ttft_ms=c.ttft_ms,
                    now=now,
                )
                for c in completions
            ]
        )

    def settle_claimable(
        self,
        candidates: Sequence[tuple[str, str]],
        clear: settlement.Clearing,
        fingerprints: Mapping[str, str | None] | None = None,
    ) -> ClaimedBatch:
        """Claim the open holds of `candidates` (rid, user), clear and settle them atomically;
        the others are refused with their hold's state (see `billing.settlement`)."""
        now = self._now()
        return self._write(
            lambda s: settlement.settle_claimable(s, candidates, clear, now, fingerprints)
        )

    def record_served(
        self, rid: str, cached_tokens: int | None = None, ttft_ms: float | None = None
    ) -> None:
        """Record a scheduled request served; raises `RequestNotScheduled` if recovery (or
        anything else) recorded its outcome first, `UnknownRequest` if no batch settled it."""
        if self.record_served_many([ServedInput(rid, cached_tokens, ttft_ms)])[0]:
            return
        # Not scheduled: its status can only have moved on (nothing sets it back), so a
        # later read tells why.
        found = self.find_request(rid)
        if found is None:
            raise UnknownRequest(rid, "no batch settled it")
        raise RequestNotScheduled(rid, found.status.value)

    def record_served_many(self, records: Sequence[ServedInput]) -> list[bool]:
        """Record scheduled requests served, in one transaction; result i is False where
        request i was not scheduled any more (recovery failed it first, it was recorded
        already, or no batch settled it). Raises `InvalidInput` (nothing written) for a
        malformed record."""
        if not records:
            return []
        return self._record_served(records, self._now())

    def _record_served(self, records: Sequence[ServedInput], now: datetime) -> list[bool]:
        """`record_served_many`: one record alone is one statement (`_serve_one`)."""
        if len(records) == 1:
            return [self._serve_one(records[0], now)]
        return self._write(lambda s: request_log.serve_scheduled(s, records, now))

    def record_abandoned(
        self, rid: str, cached_tokens: int | None = None, ttft_ms: float | None = None
    ) -> None:
        """Record a scheduled request `abandoned`: its client left after its first token was
        produced, so it keeps its charge (docs/SPEC.md, "A client that leaves"); raises
        `RequestNotScheduled` as `record_served`."""
        now = self._now()
        self._write(
            lambda s: request_log.finish_scheduled(
                s,
                rid,
                status=RequestStatus.ABANDONED,
                cached_tokens=cached_tokens,
                ttft_ms=ttft_ms,
                now=now,
            )
        )

    def record_failed(
        self, rid: str, batch_id: str, name: str, *, target_micros: int, reason: str
    ) -> RefundResult:
        """Record a scheduled request failed and bring its user's refunds in the batch up to
        `target_micros`, in one transaction; raises `RequestNotScheduled` as `record_served`."""
        now = self._now()
        return self._write(
            lambda s: recovery.fail_request(
                s,
                rid,
                batch_id,
                name,
                target_micros=target_micros,
                rule=None,
                reason=reason,
                now=now,
            )
        )

    def refund_unserved(
        self, older_than: timedelta, rule: RefundRule | None = None
    ) -> list[RefundResult]:
        """Fail every request `scheduled` for longer than `older_than` and refund it by `rule`
        (without one, or for batches settled without their tree shape: the whole charge);
        returns the refunds made (a failed request whose failure is worth nothing makes none).

        Safe at any time, on any replica, while servers run: a request is failed only if it is
        still scheduled, and a server records an answer only if it is, so each request is
        either served (answered, charged) or failed (unanswered, refunded). Idempotent."""
        now = self._now()
        cutoff = now - older_than
        stale = self._read(lambda s: recovery.stale_scheduled(s, cutoff))
        results = [
            self._write(
                partial(
                    recovery.recover_request,
                    rid=rid,
                    batch_id=batch_id,
                    name=name,
                    rule=rule,
                    cutoff=cutoff,
                    now=now,
                )
            )
            for rid, batch_id, name in stale
        ]
        return [
            result
            for result in results
            if result is not None
            and (result.amount_micros or result.fee_micros or result.floor_micros)
        ]

    def find_request(self, rid: str) -> RequestView | None:
        """The settled request `rid`, or None if no batch settled it."""
        return self._read(lambda s: request_log.find_request(s, rid))

    # Queries

    def balance(self, name: str) -> BalanceView:
        """The user's balance, held and available funds and this period's spend."""
        now = self._now()
        return self._read(lambda s: queries.balance(s, name, now))

    def entries(
        self,
        name: str,
        since: datetime | None = None,
        until: datetime | None = None,
        kind: str | EntryKind | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> EntryPage:
        """A page of the user's entries created in [since, until), oldest first."""
        return self._read(
            lambda s: queries.entries(
                s, name, since=since, until=until, kind=kind, limit=limit, cursor=cursor
            )
        )

    def summary(
        self,
        name: str,
        by: str = "day",
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[SummaryView]:
        """Totals per day, week or month in the user's time zone."""
        return self._read(lambda s: queries.summary(s, name, by, since, until))

    def export(
        self,
        name: str | None,
        fmt: str = "csv",
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> str:
        """The user's entries (every user's when `name` is None) as `csv` or `json`."""
        return self._read(lambda s: render(queries.iter_entries(s, name, since, until), fmt))

    def schema_revision(self) -> str | None:
        """The migration revision the database is at (None: not migrated)."""
        return migrate.current_revision(self._engine)

    def warn_if_autovacuum_off(self) -> list[str]:
        """Say in one WARNING line where PostgreSQL's autovacuum is off for the ledger's
        tables (`billing.autovacuum`), as a server starts; returns where (none on SQLite)."""
        if self.dialect_name != "postgresql":
            return []
        return self._read(lambda s: autovacuum.warn_if_autovacuum_off(s.connection()))

    def ping(self) -> None:
        """Raise unless the database answers a trivial query (for health checks)."""
        self._read(lambda s: s.execute(text("SELECT 1")))

    # The pricing rule of each running replica (`billing.replica_rules`)

    def join_replicas(
        self,
        process: replica_rules.ReplicaProcess,
        rule: replica_rules.Rule,
        live_within: timedelta = timedelta(seconds=30),
    ) -> None:
        """Record that `process` clears under `rule` (pricing rule, priority slots, request
        fee, tiers); raises `RuleDisagreement` if another process seen within `live_within`
        clears under another, whatever its replica's name."""
        now = self._now()
        self._write(lambda s: replica_rules.join(s, process, rule, now, live_within))

    def replica_heartbeat(
        self,
        process: replica_rules.ReplicaProcess,
        rule: replica_rules.Rule,
        live_within: timedelta = timedelta(seconds=30),
    ) -> None:
        """Say again that `process` runs, under `rule`; a write, so it fails while the ledger
        cannot write."""
        now = self._now()
        self._write(lambda s: replica_rules.heartbeat(s, process, rule, now, live_within))

    def leave_replicas(self, process: replica_rules.ReplicaProcess) -> None:
        """`process` stopped: its rule binds nobody any more (other processes' rows stay)."""
        self._write(lambda s: replica_rules.leave(s, process))

    def reconcile(self) -> ReconcileView:
        """Check every balance row against the sum of its entries."""
        return self._read(reconcile.reconcile)

    # Dashboard aggregates

    def market_activity(
        self,
        window: timedelta = timedelta(minutes=15),
        width: timedelta = timedelta(seconds=15),
        *,
        points: int = 1500,
        spenders: int = 10,
    ) -> activity.MarketActivity:
        """The market over the last `window` in `width` buckets, summed in the database."""
        now = self._now()
        return self._read(
            lambda s: activity.market_activity(
                s, now, window, width, points=points, spenders=spenders
            )
        )

    def top_spenders(self, limit: int = 10) -> list[activity.Spender]:
        """The users with the highest net spend in their current budget period."""
        now = self._now()
        return self._read(lambda s: activity.top_spenders(s, now, limit))

    def prefix_squatters(
        self, window: timedelta, *, low_bid_micros: int, limit: int = 10, minimum: int = 1
    ) -> list[decoy_watch.PrefixSquatter]:
        """Accounts whose low-bid requests sat under other users' prefixes (`decoy_watch`)."""
        since = self._now() - window
        return self._read(
            lambda s: decoy_watch.prefix_squatters(
                s, since, low_bid_micros=low_bid_micros, limit=limit, minimum=minimum
            )
        )

    def account_activity(
        self, name: str, *, points: int = 120, recent: int = 50, clearing: int = 300
    ) -> activity.AccountActivity:
        """The user's spend this period, request counts, recent requests and charges."""
        now = self._now()
        return self._read(
            lambda s: activity.account_activity(
                s, name, now, points=points, recent=recent, clearing=clearing
            )
        )

    # Pacing figures

    def spend_since(self, name: str, since: datetime) -> market.SpendView:
        """Charges net of refunds since `since`, and how many auctions the user took part in."""
        return self._read(lambda s: market.spend_since(s, name, since))

    def auctions_since(self, name: str, since: datetime) -> int:
        """Batches closed since `since` that held at least one of the user's requests."""
        return self._read(lambda s: market.auctions_since(s, name, since))

    def recent_clearing(self, since: datetime, max_batches: int) -> list[market.ClearingSample]:
        """Every user's priority and charge in the latest `max_batches` batches since `since`."""
        return self._read(lambda s: market.recent_clearing(s, since, max_batches))

    def clearing_after(self, after: datetime, limit: int) -> list[market.ClearingSample]:
        """Every user's priority and charge in the first `limit` batches closed after `after`."""
        return self._read(lambda s: market.clearing_after(s, after, limit))
