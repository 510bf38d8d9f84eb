"""What a newcomer trips on at the command line: a busy port, a password on the console,
tables cut at 80 columns in a pipe, an unexplained schedule, untracked SQLite side files."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from inference_auctions.server.cli.serve_command import _first_steps
from inference_auctions.server.settings import ServerSettings
from tests.processes import free_port

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "batch.jsonl"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "inference_auctions.server.cli",
        *args,
    ]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)


def test_serve_on_a_busy_port_fails_before_the_banner(tmp_path: Path) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        database = f"sqlite:///{tmp_path / 'ledger.db'}"
        result = _cli("serve", "--port", str(port), "--database-url", database)
    assert result.returncode != 0
    assert "serving on" not in result.stdout and "First steps" not in result.stdout
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "--port" in result.stderr and "INFERENCE_AUCTION_PORT" in result.stderr
    assert "Traceback" not in result.stderr and "Errno" not in result.stderr


def test_serve_never_prints_the_database_password() -> None:
    url = "postgresql+psycopg://auction:s3cret-pa55@db.example:5432/ledger"
    banner = _first_steps(ServerSettings(database_url=url))
    assert "s3cret-pa55" not in banner
    assert "postgresql+psycopg://auction:***@db.example:5432/ledger" in banner
    plain = _first_steps(ServerSettings(database_url="sqlite:///other.db"))
    assert "--database-url 'sqlite:///other.db'" in plain


def test_tables_in_a_pipe_print_whole_values(tmp_path: Path) -> None:
    long_user = "a-user-name-long-enough-to-push-the-table-past-eighty-columns-" + "x" * 40
    batch = tmp_path / "batch.jsonl"
    batch.write_text(f'{{"rid": "r1", "user": "{long_user}", "tokens": [1, 2], "bid": "0.5"}}\n')
    result = _cli("auction", str(batch))  # stdout is a pipe here
    assert result.returncode == 0, result.stderr
    assert long_user in result.stdout
    assert "…" not in result.stdout


def test_the_schedule_says_that_subtrees_go_by_average_bid() -> None:
    result = _cli("auction", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    below = lines[next(i for i, line in enumerate(lines) if line.startswith("└")) + 1]
    assert "average bid" in below and "subtrees" in below


def test_sqlite_side_files_are_ignored_by_git() -> None:
    names = ["inference-auction.db", "inference-auction.db-wal", "inference-auction.db-shm"]
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", *names],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.split() == names


def test_the_readme_configuration_answers_a_newcomers_questions() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    for words in ["`HOST`", "`PORT`", "users create root --admin", "without `bid` bids 0"]:
        assert words in section, words
    settings = ServerSettings.model_fields
    for name in ["max_json_depth", "http_read_timeout_seconds", "max_connections"]:
        assert name in settings and f"`{name.upper()}`" in section


def test_the_removed_process_ledger_writer_is_refused_by_name(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'ledger.db'}"
    result = _cli("serve", "--ledger-writer", "process", "--database-url", database)
    assert result.returncode != 0
    assert "process ledger writer was removed" in result.stderr
    assert "threads of the server" in result.stderr
    assert "Traceback" not in result.stderr
    try:
        ServerSettings(ledger_writer="process")  # type: ignore[arg-type]
    except ValueError as error:  # INFERENCE_AUCTION_LEDGER_WRITER=process
        assert "process ledger writer was removed" in str(error)
    else:
        raise AssertionError("the removed writer was accepted")
