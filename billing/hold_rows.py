"""What one transaction knows of holds, as plain rows: each read at most once.

A group commit (`Ledger.commit_group`) places holds and then claims batches whose requests,
for a lone request, are the very holds it has just placed. Reading them back costs a
statement, and on PostgreSQL a round trip. `KnownHolds` keeps, for one transaction, what it
knows of each rid's hold: read from the database (all the group's rids in the group's first
round trip), placed by this transaction, or settled by it. That is exact because every hold's
state changes only under its user's lock, and the transaction holds the locks of every user
whose holds it reads or moves. A rid whose hold was placed again or after a period boundary
(`hold_groups`, in a savepoint) is forgotten, and read again when next wanted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

from sqlalchemy.orm import Session

from inference_auctions.billing.driver_sql import Columns, Query, driver_cursor
from inference_auctions.billing.models import HOLDS, HoldState

__all__ = ["HoldRow", "KnownHolds"]


class HoldRow(NamedTuple):
    """What placing and settling need to know of a hold."""

    rid: str
    user_id: int
    amount_micros: int
    state: HoldState
    period_start: datetime | None
    attempt: int
    fingerprint: str | None


_READ = Columns(HOLDS, HoldRow._fields)
_ROWS = f"SELECT {', '.join(HoldRow._fields)} FROM holds WHERE rid IN ({{in}})"


class KnownHolds:
    """The holds of one transaction's rids: None for a rid known to have no hold."""

    def __init__(self) -> None:
        self._rows: dict[str, HoldRow | None] = {}

    def query(self, rids: Iterable[str]) -> Query | None:
        """The read of those of `rids` not known yet (None if all are); its rows go to
        `learn`. Run it under the locks of the holds' users."""
        wanted = sorted({rid for rid in rids if rid not in self._rows})
        return Query(_ROWS, wanted, len(wanted)) if wanted else None

    def learn(self, query: Query, rows: Sequence[Sequence[object]], session: Session) -> None:
        """Take in the rows `query` read; its rids without a row have no hold."""
        convert = _READ.result(driver_cursor(session).dialect)
        for rid in query.params:
            self._rows[rid] = None
        for raw in rows:
            row = HoldRow._make(convert(raw))
            self._rows[row.rid] = row

    def rows(self, session: Session, rids: Iterable[str]) -> dict[str, HoldRow]:
        """The holds of `rids` that exist, reading the unknown ones (one statement)."""
        wanted = list(rids)
        query = self.query(wanted)
        if query is not None:
            found = driver_cursor(session).execute(query.sql, query.params, query.listed)
            self.learn(query, found, session)
        return {rid: row for rid in wanted if (row := self._rows[rid]) is not None}

    def placed(self, row: HoldRow) -> None:
        """This transaction wrote a new hold."""
        self._rows[row.rid] = row

    def settled(self, rids: Iterable[str]) -> None:
        """This transaction settled the open holds of `rids`."""
        for rid in rids:
            row = self._rows.get(rid)
            if row is not None:
                self._rows[rid] = row._replace(state=HoldState.SETTLED)

    def forget(self, rid: str) -> None:
        """Another path (the ORM's) may have written the hold of `rid`: read it again."""
        self._rows.pop(rid, None)
