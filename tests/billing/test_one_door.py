"""Billing has one door: the server and the migrations use only what `billing` exports, and the
server reaches no SQLAlchemy object through it."""

from __future__ import annotations

import ast
import inspect
import socket
import subprocess
import sys
import types
import typing
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
# What billing gives Alembic alone: the migrations' second way in.
SCHEMA = "inference_auctions.billing.schema"


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


def _where(path: Path, line: int) -> str:
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return f"{shown}:{line}"


def _trespasses(
    path: Path, *, sqlalchemy: bool = False, allowed: tuple[str, ...] = ()
) -> list[str]:
    found = []
    for line, module, name in _imports(path):
        where = _where(path, line)
        if module.split(".")[0] == "sqlalchemy" and not sqlalchemy:
            found.append(f"{where} imports {module}")
        elif module in allowed:
            continue
        elif module.startswith(BILLING + "."):
            found.append(f"{where} imports the billing submodule {module}")
        elif module == BILLING and name is not None and not _exported(name):
            found.append(f"{where} imports {name!r}, which billing does not export")
    return found


def _is_sqlalchemy(value: object) -> bool:
    """Whether `value` is a SQLAlchemy object, class or type (an ORM model included)."""
    kinds = [value, *getattr(value, "__mro__", ())] if isinstance(value, type) else [type(value)]
    return any(getattr(kind, "__module__", "").split(".")[0] == "sqlalchemy" for kind in kinds)


def _returns_sqlalchemy(function: object) -> bool:
    """Whether `function` (a property's getter, a method, a function) is annotated to return
    a SQLAlchemy object."""
    try:
        returned = typing.get_type_hints(function).get("return")
    except (NameError, TypeError):  # an annotation that names something only for type checks
        returned = inspect.get_annotations(function).get("return")  # type: ignore[arg-type]
    if isinstance(returned, str):
        return "sqlalchemy" in returned.lower() or returned in ("Engine", "Connection", "Session")
    return any(_is_sqlalchemy(kind) for kind in (returned, *typing.get_args(returned)) if kind)


def _sqlalchemy_attributes() -> set[str]:
    """The public attributes of billing's exported classes that give a SQLAlchemy object."""
    found = set()
    for name in billing.__all__:
        exported = getattr(billing, name)
        if not isinstance(exported, type):
            continue
        for attribute, member in vars(exported).items():
            if attribute.startswith("_"):
                continue
            getter = member.fget if isinstance(member, property) else member
            if callable(getter) and _returns_sqlalchemy(getter):
                found.add(attribute)
    return found


def _reaches_through(path: Path, attributes: set[str]) -> list[str]:
    """Uses in `path` of `attributes` on a ledger (a name or attribute chain that says
    `ledger`), and of names of the billing module that it does not export."""
    tree = ast.parse(path.read_text(), str(path))
    modules = set()  # the names the billing module itself is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "inference_auctions":
            modules |= {a.asname or a.name for a in node.names if a.name == "billing"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == BILLING and a.asname}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = ast.unparse(node.value)
        if node.attr in attributes and "ledger" in owner.lower():
            found.append(f"{_where(path, node.lineno)} reaches {owner}.{node.attr}")
        elif owner in modules and not _exported(node.attr):
            found.append(f"{_where(path, node.lineno)} reads billing.{node.attr}, not exported")
    return found


def test_the_door_exports_no_sqlalchemy_object() -> None:
    for name in billing.__all__:
        exported = getattr(billing, name)
        assert not _is_sqlalchemy(exported), name
        if callable(exported) and not isinstance(exported, type):
            assert not _returns_sqlalchemy(exported), name


def test_the_server_reaches_no_sqlalchemy_object_through_the_door() -> None:
    attributes = _sqlalchemy_attributes()
    assert "engine" in attributes  # the check knows what to look for
    files = sorted(ROOT.glob("server/**/*.py"))
    found = [problem for path in files for problem in _reaches_through(path, attributes)]
    assert found == []


def test_the_attribute_walk_catches_each_way_through_the_door(tmp_path: Path) -> None:
    probe = tmp_path / "_door_probe.py"
    probe.write_text(
        "from inference_auctions import billing\n"
        "from inference_auctions import billing as ledger_module\n"
        "def f(ledger, app):\n"
        "    ledger.engine.dialect.name\n"
        "    app.state.ledger.engine\n"
        "    self_ledger = app.ledger\n"
        "    self_ledger.engine\n"
        "    billing.metadata\n"
        "    ledger_module.models\n"
        "    ledger.dialect_name\n"
        "    app.engine\n"
        "    billing.Ledger\n"
    )
    found = _reaches_through(probe, _sqlalchemy_attributes())
    assert len(found) == 5, found
    assert not any("dialect_name" in problem or "app.engine" in problem for problem in found)


def test_the_server_imports_only_billings_public_interface() -> None:
    files = sorted(ROOT.glob("server/**/*.py"))
    assert len(files) > 50  # the walk really covers the server
    found = [problem for path in files for problem in _trespasses(path)]
    assert found == []


def test_the_walk_catches_each_kind_of_trespass(tmp_path: Path) -> None:
    bad = tmp_path / "_trespass_probe.py"
    bad.write_text(
        "from sqlalchemy.orm import Session\n"
        "import sqlalchemy\n"
        "from inference_auctions.billing.models import BatchRequest\n"
        "import inference_auctions.billing.ledger\n"
        "from inference_auctions.billing import ledger\n"
        "from inference_auctions.billing import Ledger\n"
        "from inference_auctions.billing.schema import metadata\n"
    )
    found = _trespasses(bad)
    assert len(found) == 6, found
    assert not any("'Ledger'" in problem for problem in found)
    assert len(_trespasses(bad, sqlalchemy=True, allowed=(SCHEMA,))) == 3


def test_the_migrations_read_billing_through_its_door() -> None:
    # Alembic migrations are SQLAlchemy by nature; only billing's internals are off limits.
    paths = sorted(ROOT.glob("migrations/**/*.py"))
    found = [p for path in paths for p in _trespasses(path, sqlalchemy=True, allowed=(SCHEMA,))]
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
