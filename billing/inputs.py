"""What callers hand the ledger: plain frozen records of the work to do, named `*Input`.

The ledger's answers are `*View`s (`billing.views`); what the API, the CLI and the exports
show of them are `*Record`s (`billing.schemas`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

# The ledger keys a request by its user and the client's rid, so that two users' rids never
# collide: "<user>/<rid>". `request_key` builds it and `client_rid` reads it, nothing else.
_KEY_SEPARATOR = "/"


def request_key(user: str, rid: str) -> str:
    """The ledger's (and the engine's) id of a user's request: unique across users."""
    return f"{user}{_KEY_SEPARATOR}{rid}"


def client_rid(key: str) -> str:
    """The client's own rid in a ledger request key (a key without a user is returned as is)."""
    _user, separator, rid = key.partition(_KEY_SEPARATOR)
    return rid if separator else key


@dataclass(frozen=True, slots=True)
class BatchInput:
    """A cleared batch to settle. `revenue_micros` must equal the sum of the batch's charges."""

    batch_id: str
    closed_at: datetime
    n: int
    revenue_micros: int
    welfare_micros: int
    tree_nodes: int = 0
    tree_depth: int = 0
    shared_tokens: int = 0
    total_tokens: int = 0
    # The pricing rule it was cleared under: `batch-size` (slots None), `fixed-slots`, or a
    # fixed-price mode (`tiers`, `fcfs`; slots None, no fee).
    pricing_rule: str = "batch-size"
    priority_slots: int | None = None
    request_fee_micros: int = 0


@dataclass(frozen=True, slots=True)
class RequestInput:
    """One request of a batch to settle; its hold (placed under `rid`) must still be open."""

    rid: str
    user: str
    position: int
    priority: float
    bid_micros: int
    prompt_tokens: int
    arrival: int | None = None  # index in the batch as it closed (the auction's input order)
    tree_path: Sequence[int] | None = None  # node ids from the root of the batch's radix tree
    # What the request pays of the posted price floor (docs/SPEC.md section 7), besides its
    # user's charge; 0 when none.
    floor_micros: int = 0


@dataclass(frozen=True, slots=True)
class CompletionInput:
    """How a settled request was served: `served` or `failed`, cached tokens, TTFT."""

    rid: str
    status: str
    cached_tokens: int | None = None
    ttft_ms: float | None = None


@dataclass(frozen=True, slots=True)
class HoldInput:
    """One hold to place with `Ledger.place_holds`: the arguments of `Ledger.place_hold`."""

    user: str
    rid: str
    amount_micros: int
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class ServedInput:
    """A scheduled request answered, for `Ledger.record_served_many`."""

    rid: str
    cached_tokens: int | None = None
    ttft_ms: float | None = None
