"""Accounts whose zero- or low-bid requests sit under other users' prompt prefixes.

The pricing rule closes price dilution, and a request fee makes decoys cost; what stays open
(docs/SPEC.md, section 5) is a user sending cheap requests under a competitor's prefix to drag
that subtree's average bid down, or to make a competitor's counterfactual cheaper. Such a
request shares a node of its batch's radix tree with another user's request while bidding
little. The ledger stores each request's path of node ids in its batch (`tree_path`), so the
operator's dashboard can list, over a recent window, the accounts that do this most often.
Legitimate traffic does it too (a shared system prompt, a free tier), so this is a list to
look at, not a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing.models import AuctionBatch, BatchRequest, User


@dataclass(frozen=True, slots=True)
class PrefixSquatter:
    """An account's low-bid requests in the window, and how many sat under others' prefixes."""

    user: str
    low_bid_requests: int
    under_others: int  # low-bid requests sharing a prefix node with another user's request
    other_users: int  # distinct users whose prefixes they shared
    batches: int  # batches in which it happened


def prefix_squatters(
    session: Session, since: datetime, *, low_bid_micros: int, limit: int, minimum: int = 1
) -> list[PrefixSquatter]:
    """The `limit` accounts with the most requests bidding at most `low_bid_micros` under
    another user's prefix in batches closed since `since` (at least `minimum` of them)."""
    rows = session.execute(
        select(BatchRequest.batch_id, User.name, BatchRequest.bid_micros, BatchRequest.tree_path)
        .join(User, User.id == BatchRequest.user_id)
        .join(AuctionBatch, AuctionBatch.id == BatchRequest.batch_id)
        .where(AuctionBatch.closed_at >= since)
        .order_by(BatchRequest.batch_id)
    ).all()
    by_batch: dict[str, list[tuple[str, int, list[str]]]] = {}
    for batch_id, name, bid, path in rows:
        nodes = [node for node in (path or "").split(".") if node]
        by_batch.setdefault(batch_id, []).append((name, bid, nodes))

    low: dict[str, int] = {}
    under: dict[str, int] = {}
    others: dict[str, set[str]] = {}
    batches: dict[str, set[str]] = {}
    for batch_id, requests in by_batch.items():
        users_at: dict[str, set[str]] = {}  # node id -> the users whose requests pass it
        for name, _, nodes in requests:
            for node in nodes:
                users_at.setdefault(node, set()).add(name)
        for name, bid, nodes in requests:
            if bid > low_bid_micros:
                continue
            low[name] = low.get(name, 0) + 1
            shared = {user for node in nodes for user in users_at[node]} - {name}
            if shared:
                under[name] = under.get(name, 0) + 1
                others.setdefault(name, set()).update(shared)
                batches.setdefault(name, set()).add(batch_id)
    flagged = [
        PrefixSquatter(name, low[name], count, len(others[name]), len(batches[name]))
        for name, count in under.items()
        if count >= minimum
    ]
    flagged.sort(key=lambda s: (-s.under_others, s.user))
    return flagged[:limit]
