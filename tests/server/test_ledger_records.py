"""One schema per ledger record: the API, the CLI and the exports show the same fields."""

from __future__ import annotations

import csv
import io
import json

from click.testing import CliRunner
from sqlalchemy import text

from inference_auctions.billing import BalanceRecord, DriftRecord, EntryRecord, SummaryRecord
from inference_auctions.server.cli import main
from tests.billing.helpers import hold_and_settle
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import RunningServer


def _cli(db: MigratedDatabase, *args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--database-url", db.url])
    assert result.exit_code in (0, 1), result.output
    return result.output


def _csv(output: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(output))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def test_entries_balance_and_summary_are_one_record_everywhere(
    server: RunningServer, ledger_db: MigratedDatabase
) -> None:
    key = server.create_user("alice", budget=1_000_000)
    server.create_user("bob", budget=1_000_000)
    # The server keys a request `user/rid`; every interface shows the client's `rid`.
    bids = [("alice/r1", "alice", 400_000), ("bob/r2", "bob", 100_000)]
    hold_and_settle(server.ledger, "b1", bids, {"alice": 250_000, "bob": 0})

    with server.client(key) as client:
        api_entries = client.get("/v1/ledger/entries").json()["entries"]
        api_balance = client.get("/v1/ledger/balance").json()
        api_summary = client.get("/v1/ledger/summary").json()["rows"]
    cli_entries = json.loads(_cli(ledger_db, "ledger", "entries", "alice", "--format", "json"))
    cli_header, cli_rows = _csv(_cli(ledger_db, "ledger", "entries", "alice", "--format", "csv"))
    export_header, export_rows = _csv(_cli(ledger_db, "ledger", "export", "alice"))
    exported = json.loads(_cli(ledger_db, "ledger", "export", "alice", "--format", "json"))

    columns = EntryRecord.columns()
    assert "rid" in columns and "request_id" not in columns
    assert [list(e) for e in api_entries] == [columns] * len(api_entries)
    assert [list(e) for e in cli_entries] == [columns] * len(cli_entries)
    assert [list(e) for e in exported] == [columns] * len(exported)
    assert cli_header == export_header == columns  # one column order for both CSVs
    assert api_entries == cli_entries == exported  # the same values, not only the same names
    assert cli_rows == export_rows
    charged = [e for e in api_entries if e["kind"] == "charge"]
    assert [(e["rid"], e["amount_micros"]) for e in charged] == [(None, -250_000)]
    assert {e["rid"] for e in api_entries if e["kind"] == "hold"} == {"r1"}

    cli_balance = json.loads(_cli(ledger_db, "ledger", "balance", "alice", "--format", "json"))
    assert list(api_balance) == list(cli_balance) == BalanceRecord.columns()
    assert api_balance == cli_balance
    cli_summary = json.loads(_cli(ledger_db, "ledger", "summary", "alice", "--format", "json"))
    assert [list(row) for row in api_summary] == [SummaryRecord.columns()] * len(api_summary)
    assert api_summary == cli_summary


def test_reconcile_shows_the_same_drift_record_in_the_api_and_the_cli(
    server: RunningServer, ledger_db: MigratedDatabase
) -> None:
    admin = server.create_user("root", admin=True)
    server.create_user("alice", budget=1_000)
    server.ledger.place_hold("alice", "alice/r1", 300)
    with server.ledger.engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE balances SET balance_micros = 700 WHERE user_id IN "
                "(SELECT id FROM users WHERE name = 'alice')"
            )
        )
    with server.client(admin) as client:
        api = client.get("/v1/admin/reconcile").json()
    cli = json.loads(_cli(ledger_db, "ledger", "reconcile", "--format", "json").split("\nDrift")[0])
    assert api.pop("scope") == "deployment"
    assert api == cli
    (drift,) = api["drifts"]
    assert list(drift) == DriftRecord.columns()
    assert drift["open_holds_micros"] == 300  # dropped by the API before
    assert (drift["balance_micros"], drift["expected_balance_micros"]) == (700, 1_000)
