"""The pricing rule each running server process clears under, so that replicas sharing a ledger
agree.

Every batch of a deployment must be priced alike (docs/SPEC.md section 5): the same rule, the
same priority slots, the same request fee, or a user's price would depend on which replica
the router picked. A server process says which rule it clears under when it starts (`join`),
and again every few seconds while it runs (`heartbeat`); one that stops deletes its own row
(`leave`). Rows are per process, keyed by a random id it draws at start: replica names do not
tell processes apart (every host started with `--host 0.0.0.0` is `0.0.0.0:8000`), so a
process with the same name as a live one is refused like any other when its rule differs, and
a stopping one never deletes another's row. A process is refused at start when another one,
seen within the liveness window, clears under another rule. To change the rule, stop every
replica, then start them with the new one; a crashed process's row lapses once the window has
passed since its last heartbeat, and the refusal says when that is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from inference_auctions.billing.errors import RuleDisagreement
from inference_auctions.billing.models import ReplicaRule
from inference_auctions.billing.postings import check_id

# (pricing rule, priority slots, request fee, the tiers sold under `pricing tiers`): what must
# agree.
Rule = tuple[str, int | None, int, str | None]


@dataclass(frozen=True)
class ReplicaProcess:
    """One running server process: the random id it drew at start, its replica's name, and
    where and since when it runs (for the messages of others refused beside it)."""

    id: str
    replica: str
    host: str
    pid: int
    started_at: datetime


def describe(rule: Rule) -> str:
    """A rule in words, for the refusal's message."""
    name, slots, fee, tiers = rule
    where = f"{name} ({slots} slots)" if slots is not None else name
    if tiers is not None:
        where = f"{where} ({tiers})"
    return f"{where} with a request fee of {fee} micro-credits"


def join(
    session: Session, process: ReplicaProcess, rule: Rule, now: datetime, live: timedelta
) -> None:
    """Record that `process` clears under `rule`; `RuleDisagreement` if another process seen
    since `now - live` clears under another one, whatever its replica's name."""
    check_id(process.replica, "replica")
    if session.get_bind().dialect.name == "postgresql":
        # Two replicas starting at once: the second waits, then sees the first's row.
        session.execute(text("LOCK TABLE replica_rules IN SHARE ROW EXCLUSIVE MODE"))
    # A lapsed row is a process that stopped without saying so: it binds nobody.
    session.execute(delete(ReplicaRule).where(ReplicaRule.seen_at <= now - live))
    others = session.scalars(select(ReplicaRule).where(ReplicaRule.process != process.id)).all()
    for other in sorted(others, key=lambda row: (row.replica, row.started_at, row.process)):
        theirs = _rule_of(other)
        if theirs != rule:
            raise RuleDisagreement(
                other.replica,
                describe(theirs),
                describe(rule),
                process=f"process {other.pid} on {other.host}",
                seen_at=other.seen_at,
                allowed_at=other.seen_at + live,
                now=now,
            )
    _record(session, process, rule, now)


def heartbeat(
    session: Session, process: ReplicaProcess, rule: Rule, now: datetime, live: timedelta
) -> None:
    """Say again that `process` is live and clears under `rule`. A row that is gone (this
    process could not write for longer than `live`, and a start took it for stopped) is made
    again only if the rule still agrees: `RuleDisagreement` otherwise."""
    row = session.get(ReplicaRule, process.id, populate_existing=True)
    if row is None:
        join(session, process, rule, now, live)
        return
    row.seen_at = now


def leave(session: Session, process: ReplicaProcess) -> None:
    """Forget `process`'s row, and no other: it stopped, and clears nothing any more."""
    session.execute(delete(ReplicaRule).where(ReplicaRule.process == process.id))


def _rule_of(row: ReplicaRule) -> Rule:
    return (row.pricing_rule, row.priority_slots, row.request_fee_micros, row.tiers)


def _record(session: Session, process: ReplicaProcess, rule: Rule, now: datetime) -> None:
    row = session.get(ReplicaRule, process.id, populate_existing=True)
    if row is None:
        row = ReplicaRule(
            process=process.id,
            replica=process.replica,
            host=process.host,
            pid=process.pid,
            started_at=process.started_at,
        )
        session.add(row)
    row.pricing_rule, row.priority_slots, row.request_fee_micros, row.tiers = rule
    row.seen_at = now
