"""What a newcomer trips on at the command line: a busy port, a password on the console,
tables cut at 80 columns in a pipe, an unexplained schedule, untracked SQLite side files."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from inference_auctions.server.cli import main
from inference_auctions.server.cli.first_steps import first_steps
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
    banner = first_steps(ServerSettings(database_url=url))
    assert "s3cret-pa55" not in banner
    assert "postgresql+psycopg://auction:***@db.example:5432/ledger" in banner
    plain = first_steps(ServerSettings(database_url="sqlite:///other.db"))
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


def test_the_docs_answer_a_newcomers_configuration_questions() -> None:
    reference = (REPO / "docs" / "reference" / "configuration.md").read_text()
    for name in ["host", "port", "max_json_depth", "http_read_timeout_seconds", "max_connections"]:
        assert name in ServerSettings.model_fields
        assert f"`INFERENCE_AUCTION_{name.upper()}`" in reference
    concepts = (REPO / "docs" / "concepts.md").read_text()
    assert "without `bid` bids" in concepts
    quickstart = (REPO / "docs" / "quickstart.md").read_text()
    assert "users create root --budget 0 --admin" in quickstart


def test_the_first_steps_create_a_user_the_sdk_can_pace_and_promise_no_charge() -> None:
    banner = first_steps(ServerSettings())
    # The SDK's default pacing needs a budget period: a lifetime budget fails its first call.
    assert "users create alice --budget 10 --period day" in banner
    assert "see the charge" not in banner and "pays 0" in banner
    readme = (REPO / "README.md").read_text()
    assert "users create alice --budget 10 --period day" in readme
    assert "auction.charge_micros" not in readme and "auction.request_charge_micros" in readme
    for command in ("`demo`", "`cluster`", "scale-out"):
        assert command in readme.split("| command | what |")[1], command


BAD_URLS = {
    "not-a-url": "'not-a-url' is not a database URL",
    "mysql://user@db.example/ledger": "mysql is not supported",
    "postgresql+asyncpg://user@db.example/ledger": "the asyncpg driver is not installed",
    # Two slashes: SQLAlchemy reads a host and fails on connecting, with a traceback.
    "sqlite://x.db": "'sqlite://x.db' names a host, not a file: a SQLite URL has three slashes"
    " before a relative path (sqlite:///x.db)",
}


def _one_line_error(result: subprocess.CompletedProcess[str] | Result) -> str:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    if isinstance(result, Result):
        assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _run(*args: str) -> Result:
    """The command in this process: the same code as the console script, without its start-up."""
    return CliRunner().invoke(main, list(args))


def test_serve_checks_the_database_before_its_banner(tmp_path: Path) -> None:
    refused = "postgresql+psycopg://nobody@127.0.0.1:1/ledger"  # nothing listens on port 1
    for url, says in [*BAD_URLS.items(), (refused, "cannot reach the ledger's database")]:
        result = _cli("serve", "--port", str(free_port()), "--database-url", url)
        assert result.returncode == 2, (url, result.stderr)
        assert "First steps" not in result.stdout and "serving on" not in result.stdout
        line = _one_line_error(result)
        assert says in line and "--database-url" in line, line
    missing_folder = tmp_path / "no-such-folder"
    url = f"sqlite:///{missing_folder / 'ledger.db'}"
    result = _cli("serve", "--port", str(free_port()), "--database-url", url)
    assert result.returncode == 2
    assert _missing_folder_named(_one_line_error(result), missing_folder)


def _missing_folder_named(line: str, folder: Path) -> bool:
    return f"the folder {folder} of the SQLite file does not exist" in line and (
        f"mkdir -p {folder}" in line
    )


def test_ledger_commands_refuse_a_bad_url_in_one_line(tmp_path: Path) -> None:
    missing_folder = tmp_path / "no-such-folder"
    commands = (["users", "list"], ["ledger", "balance", "alice"], ["db", "current"])
    for command in (*commands, ["db", "upgrade"]):
        for url, says in BAD_URLS.items():
            result = _run(*command, "--database-url", url)
            assert result.exit_code == 2, (command, url)
            assert says in _one_line_error(result)
        # Not "run db upgrade": that would fail too, on the folder it did not name.
        result = _run(*command, "--database-url", f"sqlite:///{missing_folder / 'x.db'}")
        assert result.exit_code == 2, command
        line = _one_line_error(result)
        assert _missing_folder_named(line, missing_folder) and "db upgrade" not in line, line
    assert not missing_folder.exists()


def test_reading_commands_create_no_database_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    for command in (
        ["users", "list"],
        ["ledger", "balance", "alice"],
        ["ledger", "entries", "alice"],
        ["ledger", "reconcile"],
        ["db", "current"],
        ["db", "check"],
    ):
        result = _run(*command, "--database-url", url)
        assert result.exit_code == 2, command
        line = _one_line_error(result)
        assert f"there is no ledger at {path}" in line
        assert f"inference-auction db upgrade --database-url '{url}'" in line
        assert not path.exists(), command
    assert _run("db", "upgrade", "--database-url", url).exit_code == 0
    assert path.exists()
    listed = _run("users", "list", "--database-url", url)
    assert listed.exit_code == 0, listed.stderr


def test_an_old_schema_is_named_and_the_upgrade_hint_keeps_the_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = "7c1d2e9a4b60"  # the revision before per-request outcomes
    assert _run("db", "upgrade", "--revision", old, "--database-url", url).exit_code == 0
    result = _run("users", "list", "--database-url", url)
    line = _one_line_error(result)
    assert f"is at schema revision {old}" in line and "nothing" not in line
    assert f"run `inference-auction db upgrade --database-url '{url}'` first" in line
    check = _run("db", "check", "--database-url", url)
    assert check.exit_code == 1
    drift = check.stderr.strip().splitlines()
    assert "drift: column auction_requests.tree_path is missing from the database" in drift
    assert not [line for line in drift if "Table(" in line or "Column(" in line], drift


def test_make_run_and_demo_install_the_server_and_sdk_without_the_dev_tools() -> None:
    makefile = (REPO / "Makefile").read_text()
    rules = dict(re.findall(r"^([\w$().-]+):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.MULTILINE))
    assert "$(RUNTIME_STAMP)" in makefile.split("\nrun:", 1)[1].splitlines()[0]
    assert "$(RUNTIME_STAMP)" in makefile.split("\ndemo:", 1)[1].splitlines()[0]
    recipe = rules["$(RUNTIME_STAMP)"]
    assert "-e ./sdk -e ." in recipe and "dev" not in recipe


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
