"""Fill a ledger with many settled batches at once, and send real traffic to a server.

Settling one batch through `Ledger.settle_batch` (with its holds) takes 10-30 ms on a busy
machine, so 10,000 of them would take minutes. `seed_batches` writes the very rows a
settlement writes (batch, requests, settled holds, hold/release/charge entries, balances) in a
few bulk statements on the ledger's own engine; the caller checks `ledger.reconcile()`.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update

from inference_auctions.billing import Ledger
from inference_auctions.billing.models import (
    AuctionBatch,
    Balance,
    BatchRequest,
    EntryKind,
    Hold,
    HoldState,
    LedgerEntry,
    RequestStatus,
    User,
)
from tests.server.harness import RunningServer


def create_users_before(ledger: Ledger, names: list[str], ago: timedelta) -> dict[str, str]:
    """Users (budget 1,000,000 credits) created `ago` before now, so that batches seeded in
    between fall in their budget period; returns their API keys."""
    past = Ledger(ledger.engine, clock=lambda: datetime.now(UTC) - ago)
    return {name: past.create_user(name, budget_micros=10**12).api_key for name in names}


def seed_batches(
    ledger: Ledger, users: list[str], batches: int, span: timedelta, per_batch: int = 2
) -> dict[str, int]:
    """Settle `batches` batches of `per_batch` requests, closed evenly over the last `span`;
    returns each user's total charge in micro-credits."""
    now = datetime.now(UTC)
    with ledger.engine.begin() as connection:
        ids = dict(connection.execute(select(User.name, User.id).where(User.name.in_(users))).all())
        rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        charged: dict[str, int] = defaultdict(int)
        cycle = itertools.cycle(users)
        for b in range(batches):
            batch_id = f"seed-{b:06d}"
            closed = now - span + span * (b + 1) / (batches + 1)
            members = [next(cycle) for _ in range(per_batch)]
            charges: dict[str, int] = defaultdict(int)
            for position, name in enumerate(members):
                rid = f"{name}/seed-{b}-{position}"
                bid = 20_000 + 1_000 * ((b * 7 + position * 13) % 50)
                priority = 1.0 if per_batch == 1 else (per_batch - 1 - position) / (per_batch - 1)
                # A stand-in for the VCG charge: below the bid, higher for higher priority.
                charges[name] += bid * (position + 1 < per_batch) // 2
                common = {"user_id": ids[name], "created_at": closed, "request_id": rid}
                rows["holds"].append(
                    {
                        "rid": rid,
                        "user_id": ids[name],
                        "amount_micros": bid,
                        "state": HoldState.SETTLED,
                        "batch_id": batch_id,
                        "created_at": closed,
                        "closed_at": closed,
                    }
                )
                rows["entries"] += [
                    {
                        **common,
                        "kind": EntryKind.HOLD,
                        "amount_micros": bid,
                        "idempotency_key": f"hold:{rid}",
                        "batch_id": None,
                        "reason": None,
                    },
                    {
                        **common,
                        "kind": EntryKind.RELEASE,
                        "amount_micros": -bid,
                        "idempotency_key": f"release:{rid}",
                        "batch_id": batch_id,
                        "reason": f"settled in batch {batch_id}",
                    },
                ]
                rows["requests"].append(
                    {
                        "rid": rid,
                        "batch_id": batch_id,
                        "user_id": ids[name],
                        "position": position,
                        "priority": priority,
                        "bid_micros": bid,
                        "prompt_tokens": 100,
                        "cached_tokens": 40 + b % 60,
                        "ttft_ms": 20.0 + b % 30,
                        "status": RequestStatus.SERVED,
                        "updated_at": closed,
                    }
                )
            for name, amount in charges.items():
                if amount:
                    charged[name] += amount
                    rows["entries"].append(
                        {
                            "user_id": ids[name],
                            "created_at": closed,
                            "request_id": None,
                            "kind": EntryKind.CHARGE,
                            "amount_micros": -amount,
                            "idempotency_key": f"charge:{ids[name]}:{batch_id}",
                            "batch_id": batch_id,
                            "reason": f"VCG payment in batch {batch_id}",
                        }
                    )
            rows["batches"].append(
                {
                    "id": batch_id,
                    "closed_at": closed,
                    "n": per_batch,
                    "revenue_micros": sum(charges.values()),
                    "welfare_micros": 3 * sum(charges.values()),
                    "tree_nodes": per_batch,
                    "tree_depth": 1,
                    "shared_tokens": 0,
                    "total_tokens": 100 * per_batch,
                    "fingerprint": "0" * 64,
                    "settled_at": closed,
                }
            )
        connection.execute(insert(AuctionBatch), rows["batches"])
        connection.execute(insert(Hold), rows["holds"])
        connection.execute(insert(BatchRequest), rows["requests"])
        connection.execute(insert(LedgerEntry), rows["entries"])
        for name, amount in charged.items():
            connection.execute(
                update(Balance)
                .where(Balance.user_id == ids[name])
                .values(balance_micros=Balance.balance_micros - amount)
            )
    return dict(charged)


async def _traffic(server: RunningServer, keys: dict[str, str], rounds: int) -> None:
    # Users bid differently on prompts that share prefixes, all at once, so that batches hold
    # several users and the VCG charges are not zero.
    # The first user by name bids most, so it is charged (the lowest bidder never is).
    bids = {name: f"0.{50 - 7 * i:02d}" for i, name in enumerate(sorted(keys))}
    tag = secrets.token_hex(3)  # new request ids on every call: a known rid would be a replay

    async def send(name: str, key: str, index: int) -> None:
        async with server.async_client(key) as client:
            reply = await client.post(
                "/generate",
                json={
                    "text": f"Shared system prompt {index % 3}. {name} asks question {index}.",
                    "bid": bids[name],
                    "rid": f"{name}-{tag}-{index}",
                    "sampling_params": {"max_new_tokens": 4},
                },
            )
            assert reply.status_code == 200, reply.text

    for round_ in range(rounds):
        await asyncio.gather(
            *(send(name, key, round_ * 10 + k) for name, key in keys.items() for k in range(2))
        )


def send_traffic(server: RunningServer, keys: dict[str, str], rounds: int = 4) -> None:
    """Each user sends two concurrent requests per round, every user at once.

    Synchronous on purpose, with an event loop of its own (asyncio.run): sync fixtures and the
    browser tests call it between blocking steps; an async test calls it in a thread."""
    asyncio.run(_traffic(server, keys, rounds))
