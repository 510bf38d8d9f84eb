"""Export of ledger entries as CSV or JSON, money as integer `amount_micros`."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from typing import Any

from billing.errors import InvalidInput
from billing.records import EntryView

FORMATS = ("csv", "json")
COLUMNS = (
    "id",
    "created_at",
    "user",
    "kind",
    "amount_micros",
    "batch_id",
    "request_id",
    "reason",
    "idempotency_key",
    "period_start",
)


def entry_record(entry: EntryView) -> dict[str, Any]:
    """An entry as a JSON-ready dict (ISO 8601 UTC time, integer micro-credits)."""
    return {
        "id": entry.id,
        "created_at": entry.created_at.isoformat(),
        "user": entry.user,
        "kind": entry.kind.value,
        "amount_micros": entry.amount_micros,
        "batch_id": entry.batch_id,
        "request_id": entry.request_id,
        "reason": entry.reason,
        "idempotency_key": entry.idempotency_key,
        "period_start": None if entry.period_start is None else entry.period_start.isoformat(),
    }


def render(entries: Iterable[EntryView], fmt: str) -> str:
    """Render entries as `csv` (with a header row) or `json` (an array of objects)."""
    if fmt == "json":
        return json.dumps([entry_record(e) for e in entries], indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for entry in entries:
            writer.writerow(entry_record(entry))
        return out.getvalue()
    raise InvalidInput("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
