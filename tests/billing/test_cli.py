from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

from inference_auctions.billing import Ledger
from inference_auctions.server.cli.ledger_commands import GROUPS
from tests.billing.helpers import hold_and_settle
from tests.db_fixtures import MigratedDatabase


@click.group()
def cli() -> None:
    """The ledger command groups alone, independent of the other commands."""


for _group in GROUPS:
    cli.add_command(_group)


Invoke = Callable[..., Result]


@pytest.fixture
def run(ledger_db: MigratedDatabase) -> Invoke:
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(cli, [*args, "--database-url", ledger_db.url])

    return invoke


def test_users_create_prints_the_key_once_and_it_works(run: Invoke, ledger: Ledger) -> None:
    result = run("users", "create", "alice", "--budget", "2.5", "--period", "week")
    assert result.exit_code == 0, result.output
    key = result.output.split("store it safely): ")[1].strip()
    user = ledger.authenticate(key)
    assert user is not None and user.name == "alice"
    assert ledger.balance("alice").balance_micros == 2_500_000
    listed = json.loads(run("users", "list", "--format", "json").output)
    assert [(u["name"], u["budget_micros"], u["period"]) for u in listed] == [
        ("alice", 2_500_000, "week")
    ]
    assert key not in run("users", "list").output


def test_money_options_are_exact_and_checked(run: Invoke) -> None:
    for bad, problem in (("1.0000001", "at most 6 decimal"), ("-1", "negative"), ("nan", "finite")):
        result = run("users", "create", "alice", "--budget", bad)
        assert result.exit_code == 2
        assert "--budget" in result.output and problem in result.output


def test_users_create_defaults_to_a_daily_budget(run: Invoke, ledger: Ledger) -> None:
    # A daily budget is what the SDK paces by default; a lifetime one must be asked for.
    result = run("users", "create", "alice", "--budget", "1")
    assert result.exit_code == 0, result.output
    assert "1.000000 credits per day" in result.output
    assert ledger.get_user("alice").period.value == "day"
    assert "which the SDK cannot pace" in " ".join(run("users", "create", "--help").output.split())


def test_disable_budget_and_balance(run: Invoke, ledger: Ledger) -> None:
    run("users", "create", "alice", "--budget", "1", "--period", "none")
    assert run("users", "disable", "alice").exit_code == 0
    assert ledger.get_user("alice").disabled
    result = run("budget", "set", "alice", "--budget", "3", "--period", "day", "--batch-cap", "0.5")
    assert result.exit_code == 0, result.output
    info = ledger.get_user("alice")
    # The lifetime budget has no boundary: the daily one starts at the next UTC midnight.
    assert (info.budget_micros, info.period.value, info.batch_cap_micros) == (
        1_000_000,
        "none",
        500_000,
    )
    assert (info.pending_budget_micros, info.pending_period) == (3_000_000, "day")
    assert info.pending_from is not None and info.pending_from.time().isoformat() == "00:00:00"
    assert f"From {info.pending_from.isoformat()} (the next period boundary) on" in result.output
    assert "3.000000 credits per day (UTC)" in result.output
    balance = json.loads(run("ledger", "balance", "alice", "--format", "json").output)
    assert balance["available_micros"] == 1_000_000 and balance["held_micros"] == 0
    assert "1.000000" in run("ledger", "balance", "alice").output
    result = run("users", "disable", "zed")
    assert result.exit_code == 1 and "unknown user 'zed'" in result.output


def test_entries_summary_and_export_formats(run: Invoke, ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=5_000_000)
    hold_and_settle(ledger, "b1", [("r1", "alice", 1_000_000)], {"alice": 250_000})
    entries = json.loads(run("ledger", "entries", "alice", "--format", "json").output)
    assert [e["amount_micros"] for e in entries] == [5_000_000, 1_000_000, -1_000_000, -250_000]
    charges = run("ledger", "entries", "alice", "--kind", "charge", "--format", "csv").output
    assert [row["amount_micros"] for row in csv.DictReader(io.StringIO(charges))] == ["-250000"]
    summary = json.loads(
        run("ledger", "summary", "alice", "--by", "month", "--format", "json").output
    )
    assert summary[0]["charged_micros"] == 250_000
    exported = run("ledger", "export", "--format", "csv").output
    assert exported.startswith("id,created_at,user,kind,amount_micros")
    assert len(exported.splitlines()) == 5
    assert "0.250000" in run("ledger", "entries", "alice").output
    assert "-0.250000" in run("ledger", "export", "alice", "--format", "table").output


def test_reconcile_exits_non_zero_and_names_the_drifted_accounts(
    run: Invoke, ledger: Ledger, ledger_db: MigratedDatabase
) -> None:
    ledger.create_user("alice", budget_micros=10)
    ledger.create_user("bob", budget_micros=10)
    ok = run("ledger", "reconcile")
    assert ok.exit_code == 0 and "All 2 accounts agree" in ok.output
    with ledger_db.engine.begin() as connection:
        connection.execute(text("UPDATE balances SET balance_micros = 11"))
    result = run("ledger", "reconcile")
    assert result.exit_code == 1
    assert "Drift in 2 of 2 accounts: alice, bob" in result.output
    report = json.loads(run("ledger", "reconcile", "--format", "json").output.split("\nDrift")[0])
    assert [d["user"] for d in report["drifts"]] == ["alice", "bob"]


def test_adjust_rollover_and_expire(run: Invoke, ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000_000)
    result = run("ledger", "adjust", "alice", "0.25", "--debit", "--reason", "fee", "--key", "k1")
    assert result.exit_code == 0, result.output
    run("ledger", "adjust", "alice", "0.25", "--debit", "--reason", "fee", "--key", "k1")
    assert ledger.balance("alice").balance_micros == 750_000
    assert "Opened a new period for 0 users." in run("ledger", "rollover").output
    ledger.place_hold("alice", "r1", 5)
    assert "Released 0 holds" in run("ledger", "expire-holds").output


def test_db_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    refused = runner.invoke(cli, ["users", "list", "--database-url", url])
    assert refused.exit_code == 2 and "inference-auction db upgrade" in refused.output
    upgraded = runner.invoke(cli, ["db", "upgrade", "--database-url", url])
    assert upgraded.exit_code == 0 and "Ledger schema at revision" in upgraded.output
    assert runner.invoke(cli, ["db", "check", "--database-url", url]).exit_code == 0
    current = runner.invoke(cli, ["db", "current", "--database-url", url]).output
    head = current.split("newest: ")[1].strip()
    assert current.startswith(f"database: {head}")
    down = runner.invoke(cli, ["db", "downgrade", "base", "--database-url", url])
    assert down.exit_code == 0 and "revision base" in down.output


def test_the_groups_are_registered_on_the_main_command() -> None:
    from inference_auctions.server.cli import main

    assert {"users", "budget", "ledger", "db"} <= set(main.commands)


def test_an_adjust_replayed_under_its_key_says_that_nothing_changed(
    run: Invoke, ledger: Ledger
) -> None:
    ledger.create_user("alice", budget_micros=1_000_000)
    first = run("ledger", "adjust", "alice", "0.25", "--reason", "goodwill", "--key", "k1")
    assert first.output.startswith("Adjusted 'alice' by 0.250000 credits"), first.output
    again = run("ledger", "adjust", "alice", "0.25", "--reason", "goodwill", "--key", "k1")
    assert again.exit_code == 0
    assert again.output.startswith("Already adjusted with key 'k1' at "), again.output
    assert "nothing changed" in again.output and "Adjusted" not in again.output
    assert ledger.balance("alice").balance_micros == 1_250_000


def test_entries_as_json_or_csv_give_the_next_cursor_beside_the_data(
    run: Invoke, ledger: Ledger
) -> None:
    ledger.create_user("alice", budget_micros=1_000_000)
    for key in ("a", "b"):
        ledger.adjust("alice", 1, reason="fix", key=key)
    for fmt in ("json", "csv", "table"):
        page = run("ledger", "entries", "alice", "--limit", "1", "--format", fmt)
        assert page.exit_code == 0, page.output
        cursor = page.stderr.strip().removeprefix("More entries: --cursor ")
        assert cursor and cursor != page.stderr.strip(), page.stderr
        if fmt == "json":
            assert len(json.loads(page.stdout)) == 1  # standard output is the data alone
    rest = run("ledger", "entries", "alice", "--format", "json", "--cursor", cursor)
    assert len(json.loads(rest.stdout)) == 2 and rest.stderr == ""


def test_access_changes_say_when_a_running_server_applies_them(run: Invoke, ledger: Ledger) -> None:
    from inference_auctions.server.api.deps import AuthenticationCache
    from inference_auctions.server.cli.ledger_commands import AUTHENTICATION_CACHE_SECONDS

    assert AuthenticationCache()._ttl == AUTHENTICATION_CACHE_SECONDS
    ledger.create_user("alice", budget_micros=1_000_000)
    for command in (["users", "disable"], ["users", "enable"], ["users", "rotate-key"]):
        said = run(*command, "alice").output
        assert f"Running servers apply this within {AUTHENTICATION_CACHE_SECONDS} s" in said
