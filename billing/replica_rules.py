"""The pricing rule each running replica clears under, so that replicas sharing a ledger agree.

Every batch of a deployment must be priced alike (docs/SPEC.md section 5): the same rule, the
same priority slots, the same request fee, or a user's price would depend on which replica
the router picked. A replica says which rule it clears under when it starts (`join`), and
again every few seconds while it runs (`heartbeat`); one that stops deletes its row (`leave`).
A replica is refused at start when another one, seen within the liveness window, clears under
another rule. To change the rule, stop every replica, then start them with the new one (a
crashed replica's row goes stale after the window).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from inference_auctions.billing.errors import RuleDisagreement
from inference_auctions.billing.models import ReplicaRule
from inference_auctions.billing.postings import check_id

# (pricing rule, priority slots, request fee, the tiers sold under `pricing tiers`): what must
# agree.
Rule = tuple[str, int | None, int, str | None]


def describe(rule: Rule) -> str:
    """A rule in words, for the refusal's message."""
    name, slots, fee, tiers = rule
    where = f"{name} ({slots} slots)" if slots is not None else name
    if tiers is not None:
        where = f"{where} ({tiers})"
    return f"{where} with a request fee of {fee} micro-credits"


def join(session: Session, replica: str, rule: Rule, now: datetime, live: timedelta) -> None:
    """Record that `replica` clears under `rule`; `RuleDisagreement` if a replica seen since
    `now - live` clears under another one."""
    check_id(replica, "replica")
    if session.get_bind().dialect.name == "postgresql":
        # Two replicas starting at once: the second waits, then sees the first's row.
        session.execute(text("LOCK TABLE replica_rules IN SHARE ROW EXCLUSIVE MODE"))
    others = session.scalars(
        select(ReplicaRule).where(ReplicaRule.replica != replica, ReplicaRule.seen_at >= now - live)
    ).all()
    for other in sorted(others, key=lambda row: row.replica):
        theirs: Rule = (
            other.pricing_rule,
            other.priority_slots,
            other.request_fee_micros,
            other.tiers,
        )
        if theirs != rule:
            raise RuleDisagreement(other.replica, describe(theirs), describe(rule))
    heartbeat(session, replica, rule, now)


def heartbeat(session: Session, replica: str, rule: Rule, now: datetime) -> None:
    """Say again that `replica` is live and clears under `rule`."""
    row = session.get(ReplicaRule, replica, populate_existing=True)
    if row is None:
        row = ReplicaRule(replica=replica)
        session.add(row)
    row.pricing_rule, row.priority_slots, row.request_fee_micros, row.tiers = rule
    row.seen_at = now


def leave(session: Session, replica: str) -> None:
    """Forget `replica`'s row: it stopped, and clears nothing any more."""
    row = session.get(ReplicaRule, replica)
    if row is not None:
        session.delete(row)
