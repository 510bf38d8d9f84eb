"""CHANGELOG.md: every entry names the ledger schema it needs and whether a rolling upgrade
may mix it with the version before; the newest names the migrations' head, so that a new
migration cannot land without saying what it means for an upgrade."""

from __future__ import annotations

import re
from pathlib import Path

from inference_auctions.billing.migrate import head_revision

CHANGELOG = Path(__file__).parents[1] / "CHANGELOG.md"
VERSIONS = Path(__file__).parents[1] / "migrations" / "versions"


def _migrations() -> str:
    return "".join(path.read_text() for path in VERSIONS.glob("*.py"))


def _entries() -> list[tuple[str, str]]:
    parts = re.split(r"^## (.+)$", CHANGELOG.read_text(), flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_every_entry_states_its_schema_and_rolling_upgrade() -> None:
    entries = _entries()
    assert entries and entries[-1][0] == "0.1.0"
    known = set(re.findall(r'^revision: str = "(\w+)"', _migrations(), re.MULTILINE))
    for title, body in entries:
        schema = re.search(r"^- \*\*Ledger schema:\*\* `([0-9a-f]{12})`", body, re.MULTILINE)
        assert schema, f"{title}: no ledger schema revision"
        assert schema[1] in known, f"{title}: {schema[1]} is no migration"
        upgrade = re.search(r"^- \*\*Rolling upgrade[^:]*:\*\* (\w+)", body, re.MULTILINE)
        assert upgrade, f"{title}: nothing said of a rolling upgrade"


def test_the_newest_entry_needs_the_migrations_head() -> None:
    title, body = _entries()[0]
    schema = re.search(r"\*\*Ledger schema:\*\* `([0-9a-f]{12})`", body)
    assert schema is not None
    assert schema[1] == head_revision(), f"{title} must name the head revision {head_revision()}"
