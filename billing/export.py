"""Export of ledger entries as CSV or JSON: `EntryRecord`'s fields, money as `amount_micros`."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable

from inference_auctions.billing.errors import InvalidInput
from inference_auctions.billing.schemas import EntryRecord
from inference_auctions.billing.views import EntryView

FORMATS = ("csv", "json")


def render(entries: Iterable[EntryView], fmt: str) -> str:
    """Render entries as `csv` (with a header row) or `json` (an array of objects)."""
    if fmt == "json":
        return json.dumps([EntryRecord.of(e).as_json() for e in entries], indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=EntryRecord.columns(), lineterminator="\n")
        writer.writeheader()
        for entry in entries:
            writer.writerow(EntryRecord.of(entry).as_json())
        return out.getvalue()
    raise InvalidInput("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
