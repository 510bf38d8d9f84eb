"""SQLite's durability is chosen in the database URL: `normal` by default, `full` on request."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from inference_auctions.billing import InvalidInput
from inference_auctions.billing.database import create_ledger_engine

# PRAGMA synchronous reports 1 for NORMAL and 2 for FULL.
LEVELS = {"normal": 1, "full": 2}


def _synchronous(url: str) -> tuple[int, str]:
    engine = create_ledger_engine(url)
    try:
        with engine.connect() as connection:
            level = connection.execute(text("PRAGMA synchronous")).scalar_one()
            mode = connection.execute(text("PRAGMA journal_mode")).scalar_one()
            return int(level), str(mode)
    finally:
        engine.dispose()


def test_the_default_is_normal_under_wal(tmp_path: Path) -> None:
    assert _synchronous(f"sqlite:///{tmp_path / 'ledger.db'}") == (LEVELS["normal"], "wal")


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_the_url_chooses_the_level(tmp_path: Path, level: str) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}?synchronous={level}"
    assert _synchronous(url) == (LEVELS[level], "wal")


def test_an_unknown_level_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as caught:
        create_ledger_engine(f"sqlite:///{tmp_path / 'ledger.db'}?synchronous=off")
    assert "synchronous='off'" in str(caught.value)
    assert caught.value.field == "database_url"
