"""Billing has one door: the server and the migrations use only what `billing` exports."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from inference_auctions import billing
from inference_auctions.billing import Ledger, LedgerError, LedgerUnavailable
from inference_auctions.server.cli import main

ROOT = Path(__file__).resolve().parents[2]
BILLING = "inference_auctions.billing"
MIGRATIONS = "inference_auctions.migrations"


def _imports(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) for every import in `path`; name is None for `import module`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def _exported(name: str) -> bool:
    return name in billing.__all__ and not isinstance(getattr(billing, name), types.ModuleType)


def _trespasses(path: Path, *, sqlalchemy: bool = False) -> list[str]:
    found = []
    for line, module, name in _imports(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        if module.split(".")[0] == "sqlalchemy" and not sqlalchemy:
            found.append(f"{where} imports {module}")
        elif module.startswith(BILLING + "."):
            found.append(f"{where} imports the billing submodule {module}")
        elif module == BILLING and name is not None and not _exported(name):
            found.append(f"{where} imports {name!r}, which billing does not export")
    return found


def test_the_server_imports_only_billings_public_interface() -> None:
    files = sorted(ROOT.glob("server/**/*.py"))
    assert len(files) > 50  # the walk really covers the server
    found = [problem for path in files for problem in _trespasses(path)]
    assert found == []


def test_the_walk_catches_each_kind_of_trespass(tmp_path: Path) -> None:
    bad = ROOT / "server" / "_trespass_probe.py"
    bad.write_text(
        "from sqlalchemy.orm import Session\n"
        "import sqlalchemy\n"
        "from inference_auctions.billing.models import BatchRequest\n"
        "import inference_auctions.billing.ledger\n"
        "from inference_auctions.billing import ledger\n"
        "from inference_auctions.billing import Ledger\n"
    )
    try:
        found = _trespasses(bad)
    finally:
        bad.unlink()
    assert len(found) == 5, found
    assert not any("'Ledger'" in problem for problem in found)


def test_the_migrations_read_billing_through_its_door() -> None:
    # Alembic migrations are SQLAlchemy by nature; only billing's internals are off limits.
    paths = sorted(ROOT.glob("migrations/**/*.py"))
    found = [p for path in paths for p in _trespasses(path, sqlalchemy=True)]
    assert found == []
    for path in sorted(ROOT.glob("billing/*.py")):
        assert all(not module.startswith(MIGRATIONS) for _, module, _ in _imports(path)), path


def test_billing_finds_its_alembic_config_without_importing_the_migrations() -> None:
    probe = (
        "import sys\n"
        "from inference_auctions.billing import head_revision\n"
        "assert head_revision()\n"
        "assert 'inference_auctions.migrations' not in sys.modules, 'billing imported migrations'\n"
    )
    command = [sys.executable, "-c", probe]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_database_that_is_away_is_the_ledgers_own_unavailable_error(
    kind: str, tmp_path: Path
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'no-such-dir' / 'ledger.db'}"
    else:
        url = f"postgresql://auction:secret@127.0.0.1:{_closed_port()}/test?connect_timeout=2"
    with Ledger.from_url(url) as ledger:
        with pytest.raises(LedgerUnavailable) as read:
            ledger.balance("alice")
        with pytest.raises(LedgerUnavailable) as write:
            ledger.create_user("alice", budget_micros=1)
    for error in (read.value, write.value):
        assert isinstance(error, LedgerError)
        assert "unavailable" in error.message
        assert error.cause  # the driver's reason, for the log
        assert "secret" not in error.cause


def test_the_cli_names_an_unreachable_database_without_its_password() -> None:
    url = f"postgresql://auction:secret@127.0.0.1:{_closed_port()}/test?connect_timeout=2"
    result = CliRunner().invoke(main, ["db", "current", "--database-url", url])
    assert result.exit_code == 1
    assert "cannot use the database at postgresql://auction:***@127.0.0.1" in (result.output)
    assert "secret" not in result.output
    assert "Traceback" not in result.output


def test_each_concept_is_one_class() -> None:
    # Two classes of one name in the server and billing (an HTTP error and a ledger error, an
    # auction input and an ORM row) are imported for each other sooner or later.
    defined: dict[str, list[str]] = {}
    for path in sorted([*ROOT.glob("server/**/*.py"), *ROOT.glob("billing/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in defined.items() if len(paths) > 1} == {}
