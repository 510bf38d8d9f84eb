"""`users keys|limits|actions` and `ledger grant` on SQLite and PostgreSQL: the same ledger
operations as the HTTP admin API, recorded as made from the command line."""

from __future__ import annotations

import json

from inference_auctions.billing import Ledger
from inference_auctions.server.cli.ledger_commands import cli_actor
from tests.billing.test_cli import Invoke, run

__all__ = ["run"]


def test_keys_are_created_listed_and_revoked(run: Invoke, ledger: Ledger) -> None:
    assert run("users", "create", "alice", "--budget", "1").exit_code == 0
    made = run("users", "keys", "create", "alice", "ci", "--expires", "2099-01-01T00:00")
    assert made.exit_code == 0, made.output
    key = made.output.splitlines()[-1]
    assert "valid until 2099-01-01T00:00:00+00:00" in made.output
    user = ledger.authenticate(key)
    assert user is not None and user.name == "alice"
    listed = json.loads(run("users", "keys", "list", "alice", "--format", "json").output)
    assert [(k["name"], k["expires_at"]) for k in listed] == [
        ("default", None),
        ("ci", "2099-01-01T00:00:00+00:00"),
    ]
    assert key not in run("users", "keys", "list", "alice").output
    assert run("users", "keys", "revoke", "alice", "ci").exit_code == 0
    assert ledger.authenticate(key) is None
    again = run("users", "keys", "revoke", "alice", "ci")
    assert again.exit_code != 0 and "no API key named 'ci'" in again.output


def test_limits_are_set_shown_and_removed(run: Invoke, ledger: Ledger) -> None:
    run("users", "create", "alice", "--budget", "1")
    result = run("users", "limits", "alice", "--rpm", "60", "--tpm", "20000")
    assert result.exit_code == 0, result.output
    assert "60 requests per minute, 20,000 tokens per minute" in result.output
    assert run("users", "limits", "alice", "--rpm", "none").exit_code == 0
    info = ledger.get_user("alice")
    assert (info.requests_per_minute, info.tokens_per_minute) == (None, 20_000)
    assert "no limit requests per minute" in run("users", "limits", "alice").output
    bad = run("users", "limits", "alice", "--tpm", "0")
    assert bad.exit_code != 0 and "tokens_per_minute" in bad.output
    worse = run("users", "limits", "alice", "--tpm", "many")
    assert worse.exit_code == 2 and "'many' is not a whole number" in worse.output


def test_grant_counts_once_per_period_and_actions_name_the_cli(run: Invoke, ledger: Ledger) -> None:
    run("users", "create", "alice", "--budget", "1")
    first = run("ledger", "grant", "alice", "2", "--reason", "launch week")
    assert first.exit_code == 0, first.output and "Granted 'alice' 2" in first.output
    second = run("ledger", "grant", "alice", "2")
    assert "Already granted 2.000000 credits this period" in second.output
    assert ledger.balance("alice").available_micros == 3_000_000
    actions = json.loads(run("users", "actions", "--format", "json").output)
    assert [(a["actor"], a["action"]) for a in actions] == [
        (cli_actor(), "create_user"),
        (cli_actor(), "grant"),
    ]
    assert cli_actor().startswith("cli:")
