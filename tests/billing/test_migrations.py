from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from inference_auctions.billing import Ledger, migrate
from inference_auctions.billing.database import create_ledger_engine
from inference_auctions.billing.models import Base
from tests.db_fixtures import MigratedDatabase

VERSIONS = Path(migrate.INI_PATH).parent / "versions"


def test_the_models_and_the_migrations_agree(ledger_db: MigratedDatabase) -> None:
    assert migrate.schema_drift(ledger_db.engine) == []
    assert migrate.current_revision(ledger_db.engine) == migrate.head_revision()


def test_drift_between_models_and_database_is_detected(ledger_db: MigratedDatabase) -> None:
    with ledger_db.engine.begin() as connection:
        connection.execute(text("ALTER TABLE users ADD COLUMN nickname VARCHAR(20)"))
    drift = migrate.schema_drift(ledger_db.engine)
    assert [(d[0], d[2], d[3].name) for d in drift] == [("remove_column", "users", "nickname")]


def test_downgrade_to_base_and_back(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.engine)
    ledger.create_user("alice", budget_micros=5)
    migrate.downgrade(ledger_db.engine, "base")
    tables = set(inspect(ledger_db.engine).get_table_names()) - {"alembic_version"}
    assert tables == set()
    assert migrate.current_revision(ledger_db.engine) is None
    migrate.upgrade(ledger_db.engine)
    assert set(inspect(ledger_db.engine).get_table_names()) >= set(Base.metadata.tables)
    assert migrate.schema_drift(ledger_db.engine) == []
    assert ledger.list_users() == []


def test_migration_files_are_dated() -> None:
    names = sorted(p.name for p in VERSIONS.glob("*.py") if p.name != "__init__.py")
    assert names
    for name in names:
        assert re.fullmatch(r"\d{4}_\d{2}_\d{2}_\d{4}-[0-9a-f]{12}_\w+\.py", name), name


def test_upgrade_without_url_uses_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'from-settings.db'}"
    monkeypatch.setenv("INFERENCE_AUCTION_DATABASE_URL", url)
    migrate.upgrade()
    engine = create_ledger_engine(url)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


def test_upgrade_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    migrate.upgrade("sqlite:///relative.db")
    assert (tmp_path / "relative.db").exists()
    assert migrate.current_revision("sqlite:///relative.db") == migrate.head_revision()
