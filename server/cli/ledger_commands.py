"""`inference-auction users|budget|ledger|db`: operate the ledger from the command line.

Every command takes `--database-url` (default: `INFERENCE_AUCTION_DATABASE_URL`, else the
SQLite file `inference-auction.db`). Money goes in as credits (decimal, at most 6 decimals)
and comes out as credits in tables and as integer `*_micros` fields in JSON and CSV.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import getpass
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO, TypeVar

import click
from rich.table import Table

from inference_auctions.billing import (
    BalanceRecord,
    DriftRecord,
    EntryRecord,
    InvalidAmount,
    InvalidInput,
    Ledger,
    LedgerError,
    LedgerRecord,
    LedgerSettings,
    LedgerUnavailable,
    Period,
    ReconcileRecord,
    SummaryRecord,
    check_database_url,
    describe_drift,
    downgrade_schema,
    format_micros,
    head_revision,
    mask_database_url,
    parse_credits,
    schema_drift,
    schema_revision,
    sqlite_file,
    upgrade_schema,
)
from inference_auctions.server.cli.console import table_console

F = TypeVar("F", bound=Callable[..., Any])

PERIODS = click.Choice(["none", "day", "week", "month"])
TABLE_FORMATS = click.Choice(["table", "json", "csv"])


def _credits(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    # Credits are parsed from the text exactly as typed: no float in between.
    if value is None:
        return None
    try:
        return parse_credits(value, param.name or "amount")
    except InvalidAmount as error:
        raise click.BadParameter(error.problem, ctx, param) from None


def _moment(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    # ISO 8601; a time without an offset is taken as UTC.
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 time like 2025-01-31T12:00Z", ctx, param
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def cli_actor() -> str:
    """Who the ledger records as making a change from the command line: `cli:<login>`."""
    try:
        login = getpass.getuser()
    except (OSError, KeyError):  # no login name in a bare container: the uid says who
        login = f"uid{os.getuid()}"
    return f"cli:{login}"


def database_option(command: F) -> F:
    """Add `--database-url` to a command."""
    return click.option(
        "--database-url",
        metavar="URL",
        default=None,
        help="SQLAlchemy URL of the ledger [default: $INFERENCE_AUCTION_DATABASE_URL or"
        " sqlite:///inference-auction.db].",
    )(command)


class DatabaseProblem(click.ClickException):
    """A database URL that cannot be used as given: one line, exit status 2."""

    exit_code = 2


def _url(database_url: str | None) -> str:
    url = database_url or LedgerSettings().database_url
    try:
        check_database_url(url)
    except InvalidInput as error:
        given = "--database-url" if database_url else "INFERENCE_AUCTION_DATABASE_URL"
        raise DatabaseProblem(f"{given}: {error.problem}") from None
    return url


def upgrade_hint(database_url: str | None) -> str:
    """The `db upgrade` command for the database the user named, as the user named it."""
    if not database_url:
        return "inference-auction db upgrade"
    shown = mask_database_url(database_url)
    password = "  (with your password for ***)" if shown != database_url else ""
    return f"inference-auction db upgrade --database-url '{shown}'{password}"


def _require_existing(url: str, database_url: str | None) -> None:
    # Only `db upgrade` (and `serve`) create a ledger: a command that reads one must not leave
    # an empty SQLite file behind when given a path that holds none.
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise DatabaseProblem(
            f"there is no ledger at {path}: create it with `{upgrade_hint(database_url)}`, or "
            "start `inference-auction serve`, which creates it"
        )


@contextmanager
def _reachable(url: str) -> Iterator[None]:
    # An unreachable or unreadable database is an operator's problem: one line, no traceback.
    try:
        yield
    except LedgerUnavailable as error:
        where = mask_database_url(url)
        raise click.ClickException(f"cannot use the database at {where}: {error.cause}") from None


@contextmanager
def open_ledger(database_url: str | None) -> Iterator[Ledger]:
    """A ledger on an up-to-date database; ledger errors become one-line CLI errors."""
    url = _url(database_url)
    _require_existing(url, database_url)
    ledger = Ledger.from_url(url)
    try:
        with _reachable(url):
            current = ledger.schema_revision()
            where = mask_database_url(url)
            if current is None:
                raise click.ClickException(
                    f"the database at {where} holds no ledger tables yet; run "
                    f"`{upgrade_hint(database_url)}` first"
                )
            if current != head_revision():
                raise click.ClickException(
                    f"the ledger at {where} is at schema revision {current}, not this version's "
                    f"{head_revision()}; run `{upgrade_hint(database_url)}` first"
                )
            yield ledger
    except LedgerError as error:
        raise click.ClickException(error.message) from None
    finally:
        ledger.close()


@contextmanager
def open_database(database_url: str | None, *, create: bool = False) -> Iterator[str]:
    """The URL for the `db` commands; an unreachable database is a one-line CLI error. Only
    with `create` may a SQLite file that does not exist yet be made."""
    url = _url(database_url)
    if not create:
        _require_existing(url, database_url)
    with _reachable(url):
        yield url


def _json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot serialize {type(value).__name__}")


def _record(item: Any) -> dict[str, Any]:
    record: dict[str, Any] = dataclasses.asdict(item)
    return {
        key: _jsonable(v) if isinstance(v, datetime | enum.Enum) else v for key, v in record.items()
    }


def _emit(rows: Sequence[Any], fmt: str, columns: Sequence[tuple[str, str]], title: str) -> None:
    """Print records as a table, JSON or CSV."""
    _emit_records([_record(row) for row in rows], fmt, columns, title)


def _emit_ledger_records(
    records: Sequence[LedgerRecord],
    schema: type[LedgerRecord],
    fmt: str,
    columns: Sequence[tuple[str, str]],
    title: str,
) -> None:
    """Print billing's records as a table, or as JSON and CSV with exactly the schema's fields."""
    rows = [record.as_json() for record in records]
    _emit_records(rows, fmt, columns, title, fieldnames=schema.columns())


def _emit_records(
    records: list[dict[str, Any]],
    fmt: str,
    columns: Sequence[tuple[str, str]],
    title: str,
    out: TextIO | None = None,
    fieldnames: Sequence[str] | None = None,
) -> None:
    # `columns` pairs a record field with its table heading; *_micros fields print as credits.
    if fmt == "json":
        _json(records)
    elif fmt == "csv":
        if fieldnames is None:
            fieldnames = list(records[0]) if records else [f for f, _ in columns]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fieldnames, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        click.echo(out.getvalue(), nl=False)
    else:
        table = Table(title=title)
        for field, heading in columns:
            table.add_column(heading, justify="right" if field.endswith("_micros") else "left")
        for record in records:
            table.add_row(*(_cell(field, record[field]) for field, _ in columns))
        table_console(out).print(table)


def _cell(field: str, value: Any) -> str:
    if value is None:
        return ""
    if field.endswith("_micros"):
        return format_micros(value)
    if isinstance(value, str) and field in TIME_FIELDS:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%SZ")
    return str(value)


TIME_FIELDS = {"created_at", "period_start", "period_end", "pending_from"}


USER_COLUMNS = [
    ("name", "user"),
    ("budget_micros", "budget (credits)"),
    ("period", "period"),
    ("timezone", "time zone"),
    ("batch_cap_micros", "batch cap"),
    ("pending_budget_micros", "next budget"),
    ("pending_period", "next period"),
    ("pending_from", "from"),
    ("is_admin", "admin"),
    ("disabled", "disabled"),
    ("created_at", "created"),
]


@click.group()
def users() -> None:
    """Create, list and disable users."""


@users.command("create")
@click.argument("name")
@click.option(
    "--budget",
    "budget",
    callback=_credits,
    metavar="CREDITS",
    required=True,
    help="Credits per period.",
)
@click.option(
    "--period",
    type=PERIODS,
    default="day",
    show_default=True,
    help="Budget period (`none`: a lifetime budget, which the SDK cannot pace).",
)
@click.option("--timezone", default="UTC", show_default=True, help="Zone of the periods.")
@click.option(
    "--batch-cap",
    callback=_credits,
    metavar="CREDITS",
    default=None,
    help="Most credits at stake at once.",
)
@click.option("--admin", is_flag=True, help="Give the user admin rights.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@database_option
def create_user(
    *,
    name: str,
    budget: int,
    period: str,
    timezone: str,
    batch_cap: int | None,
    admin: bool,
    fmt: str,
    database_url: str | None,
) -> None:
    """Create user NAME with a budget and print its API key (shown only this once)."""
    with open_ledger(database_url) as ledger:
        created = ledger.create_user(
            name,
            budget_micros=budget,
            period=period,
            timezone=timezone,
            batch_cap_micros=batch_cap,
            admin=admin,
            actor=cli_actor(),
        )
    if fmt == "json":
        _json({**_record(created.user), "api_key": created.api_key})
        return
    per = "as a lifetime budget" if period == "none" else f"per {period}"
    click.echo(f"Created user {name!r} with {format_micros(budget)} credits {per}.")
    click.echo(f"API key (shown only now, store it safely): {created.api_key}")


@users.command("list")
@click.option("--format", "fmt", type=TABLE_FORMATS, default="table", show_default=True)
@database_option
def list_users(fmt: str, database_url: str | None) -> None:
    """List every user with its budget."""
    with open_ledger(database_url) as ledger:
        _emit(ledger.list_users(), fmt, USER_COLUMNS, "Users")


# A running server remembers an authenticated key this long (`AuthenticationCache`), so a
# change to a user's access reaches it within that time, not at once.
AUTHENTICATION_CACHE_SECONDS = 2
_TAKES_EFFECT = (
    f"Running servers apply this within {AUTHENTICATION_CACHE_SECONDS} s (they remember a key's "
    "user that long)."
)


@users.command("disable")
@click.argument("name")
@database_option
def disable_user(name: str, database_url: str | None) -> None:
    """Refuse new requests from NAME (requests already admitted settle normally)."""
    with open_ledger(database_url) as ledger:
        ledger.disable_user(name, actor=cli_actor())
    click.echo(f"Disabled user {name!r}. {_TAKES_EFFECT}")


@users.command("enable")
@click.argument("name")
@database_option
def enable_user(name: str, database_url: str | None) -> None:
    """Accept requests from NAME again."""
    with open_ledger(database_url) as ledger:
        ledger.enable_user(name, actor=cli_actor())
    click.echo(f"Enabled user {name!r}. {_TAKES_EFFECT}")


@users.command("rotate-key")
@click.argument("name")
@database_option
def rotate_key(name: str, database_url: str | None) -> None:
    """Give NAME a new API key named `default` (shown only this once); every older key of
    NAME stops working."""
    with open_ledger(database_url) as ledger:
        key = ledger.rotate_api_key(name, actor=cli_actor())
    click.echo(f"New API key of {name!r} (shown only now, store it safely): {key}")
    click.echo(_TAKES_EFFECT)


@click.group()
def budget() -> None:
    """Change users' budgets."""


@budget.command("set")
@click.argument("name")
@click.option(
    "--budget",
    "amount",
    callback=_credits,
    metavar="CREDITS",
    default=None,
    help="Credits per period.",
)
@click.option("--period", type=PERIODS, default=None, help="Budget period.")
@click.option("--timezone", default=None, help="IANA zone the periods follow.")
@click.option(
    "--batch-cap",
    callback=_credits,
    metavar="CREDITS",
    default=None,
    help="Most credits at stake at once.",
)
@click.option("--no-batch-cap", is_flag=True, help="Remove the batch cap.")
@database_option
def set_budget(
    *,
    name: str,
    amount: int | None,
    period: str | None,
    timezone: str | None,
    batch_cap: int | None,
    no_batch_cap: bool,
    database_url: str | None,
) -> None:
    """Change NAME's budget at the next period boundary (the batch cap at once).

    A daily, weekly or monthly budget keeps its amount, period and time zone until the end of
    the current period; the change starts the next one. A lifetime budget has no boundary: a
    new amount is granted at once (a lower one is taken back from the available funds), and a
    change to a daily, weekly or monthly period starts at that period's next boundary, where
    the lifetime funds left expire.
    """
    if batch_cap is not None and no_batch_cap:
        raise click.UsageError("give --batch-cap or --no-batch-cap, not both")
    changes: dict[str, Any] = {"budget_micros": amount, "period": period, "timezone": timezone}
    if batch_cap is not None or no_batch_cap:
        changes["batch_cap_micros"] = batch_cap
    with open_ledger(database_url) as ledger:
        before = ledger.get_user(name)
        info = ledger.set_budget(name, **changes, actor=cli_actor())
    cap = "none" if info.batch_cap_micros is None else format_micros(info.batch_cap_micros)
    click.echo(f"Budget of {name!r}: {_schedule(info.budget_micros, info.period, info.timezone)}.")
    if info.pending_from is not None:
        assert info.pending_budget_micros is not None and info.pending_period is not None
        click.echo(
            f"From {info.pending_from.isoformat()} (the next period boundary) on:"
            f" {_schedule(info.pending_budget_micros, info.pending_period, info.pending_timezone)}."
        )
    elif info.period.value == "none" and info.budget_micros != before.budget_micros:
        difference = format_micros(abs(info.budget_micros - before.budget_micros))
        click.echo(
            f"Granted {difference} more credits now."
            if info.budget_micros > before.budget_micros
            else f"Took back up to {difference} credits from the available funds now."
        )
    click.echo(f"Batch cap: {cap} (in force now).")


def _schedule(amount_micros: int, period: Period, timezone: str | None) -> str:
    if period is Period.NONE:
        return f"{format_micros(amount_micros)} credits for the user's lifetime"
    return f"{format_micros(amount_micros)} credits per {period.value} ({timezone})"


@click.group()
def ledger() -> None:
    """Balances, entries, summaries, exports and reconciliation."""


@ledger.command("balance")
@click.argument("name")
@click.option("--format", "fmt", type=TABLE_FORMATS, default="table", show_default=True)
@database_option
def show_balance(name: str, fmt: str, database_url: str | None) -> None:
    """Show NAME's balance, held and available funds and this period's spend."""
    with open_ledger(database_url) as book:
        view = book.balance(name)
    record = BalanceRecord.of(view)
    if fmt == "json":
        _json(record.as_json())
        return
    _emit_ledger_records([record], BalanceRecord, fmt, BALANCE_COLUMNS, f"Balance of {name}")


BALANCE_COLUMNS = [
    ("balance_micros", "balance"),
    ("held_micros", "held"),
    ("available_micros", "available"),
    ("spent_this_period_micros", "spent this period"),
    ("period", "period"),
    ("period_start", "period start"),
    ("period_end", "period end"),
]
ENTRY_COLUMNS = [
    ("id", "id"),
    ("created_at", "time"),
    ("kind", "kind"),
    ("amount_micros", "amount"),
    ("batch_id", "batch"),
    ("rid", "request"),
    ("reason", "reason"),
]
SUMMARY_COLUMNS = [
    ("period_start", "from"),
    ("granted_micros", "granted"),
    ("charged_micros", "charged"),
    ("refunded_micros", "refunded"),
    ("adjusted_micros", "adjusted"),
    ("fees_micros", "fees"),
    ("floors_micros", "floors"),
    ("net_micros", "net"),
    ("entries", "entries"),
]


@ledger.command("entries")
@click.argument("name")
@click.option(
    "--since",
    callback=_moment,
    metavar="TIME",
    default=None,
    help="Only entries at or after this time.",
)
@click.option(
    "--until", callback=_moment, metavar="TIME", default=None, help="Only entries before this time."
)
@click.option(
    "--kind",
    type=click.Choice(
        ["grant", "hold", "release", "charge", "refund", "adjustment", "fee", "floor"]
    ),
    default=None,
)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--cursor", default=None, help="Continue after a previous page.")
@click.option("--format", "fmt", type=TABLE_FORMATS, default="table", show_default=True)
@database_option
def list_entries(
    *,
    name: str,
    since: datetime | None,
    until: datetime | None,
    kind: str | None,
    limit: int,
    cursor: str | None,
    fmt: str,
    database_url: str | None,
) -> None:
    """List NAME's ledger entries, oldest first, one page at a time."""
    with open_ledger(database_url) as book:
        page = book.entries(name, since, until, kind, limit=limit, cursor=cursor)
    records = [EntryRecord.of(entry) for entry in page.entries]
    _emit_ledger_records(records, EntryRecord, fmt, ENTRY_COLUMNS, f"Entries of {name}")
    if page.next_cursor is not None:
        # On standard error in every format, so that JSON and CSV on standard output stay whole.
        click.echo(f"More entries: --cursor {page.next_cursor}", err=True)


@ledger.command("summary")
@click.argument("name")
@click.option("--by", type=click.Choice(["day", "week", "month"]), default="day", show_default=True)
@click.option("--since", callback=_moment, metavar="TIME", default=None)
@click.option("--until", callback=_moment, metavar="TIME", default=None)
@click.option("--format", "fmt", type=TABLE_FORMATS, default="table", show_default=True)
@database_option
def show_summary(
    *,
    name: str,
    by: str,
    since: datetime | None,
    until: datetime | None,
    fmt: str,
    database_url: str | None,
) -> None:
    """Totals of NAME's entries per day, week or month in the budget's time zone."""
    with open_ledger(database_url) as book:
        rows = [SummaryRecord.of(row) for row in book.summary(name, by, since, until)]
    _emit_ledger_records(rows, SummaryRecord, fmt, SUMMARY_COLUMNS, f"Summary of {name} by {by}")


@ledger.command("export")
@click.argument("name", required=False)
@click.option("--format", "fmt", type=TABLE_FORMATS, default="csv", show_default=True)
@click.option("--since", callback=_moment, metavar="TIME", default=None)
@click.option("--until", callback=_moment, metavar="TIME", default=None)
@click.option("--output", "-o", type=click.File("w", encoding="utf-8"), default="-")
@database_option
def export_entries(
    *,
    name: str | None,
    fmt: str,
    since: datetime | None,
    until: datetime | None,
    output: TextIO,
    database_url: str | None,
) -> None:
    """Export NAME's entries (every user's without NAME), oldest first."""
    with open_ledger(database_url) as book:
        text = book.export(name, "json" if fmt == "table" else fmt, since, until)
    if fmt != "table":
        output.write(text)
        return
    title = f"Entries of {name}" if name else "All entries"
    columns = [*ENTRY_COLUMNS[:2], ("user", "user"), *ENTRY_COLUMNS[2:]]
    _emit_records(json.loads(text), "table", columns, title, out=output)


@ledger.command("adjust")
@click.argument("name")
@click.argument("amount", callback=_credits, metavar="CREDITS")
@click.option("--reason", required=True, help="Why: kept in the entry.")
@click.option("--debit", is_flag=True, help="Take AMOUNT away instead of adding it.")
@click.option("--key", default=None, help="Idempotency key, so a retried command counts once.")
@database_option
def adjust(
    *, name: str, amount: int, reason: str, debit: bool, key: str | None, database_url: str | None
) -> None:
    """Correct NAME's balance by AMOUNT credits with an adjustment entry."""
    started = datetime.now(UTC)
    with open_ledger(database_url) as book:
        entry = book.adjust(
            name, -amount if debit else amount, reason=reason, key=key, actor=cli_actor()
        )
    if entry.created_at < started:  # the key's entry was written before: a replay
        when = entry.created_at.strftime("%Y-%m-%d %H:%M:%SZ")
        click.echo(
            f"Already adjusted with key {key!r} at {when} (entry {entry.id},"
            f" {format_micros(entry.amount_micros)} credits): nothing changed."
        )
        return
    click.echo(
        f"Adjusted {name!r} by {format_micros(entry.amount_micros)} credits (entry {entry.id})."
    )


@ledger.command("rollover")
@database_option
def rollover(database_url: str | None) -> None:
    """Open the current budget period of every user who has not used the ledger since it began.

    Optional: every hold, settlement, release and refund opens its user's period itself. The
    server runs this every ROLLOVER_INTERVAL_SECONDS (60 s by default), so that idle users'
    grant entries appear on time too.
    """
    with open_ledger(database_url) as book:
        granted = book.rollover().granted
    click.echo(
        f"Opened a new period for {len(granted)} users{': ' if granted else '.'}"
        + ", ".join(granted)
    )


@ledger.command("expire-holds")
@click.option(
    "--max-age",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds [default: from settings].",
)
@database_option
def expire_holds(max_age: float | None, database_url: str | None) -> None:
    """Release holds older than --max-age seconds: requests that never reached a batch."""
    seconds = max_age if max_age is not None else LedgerSettings().hold_max_age_seconds
    with open_ledger(database_url) as book:
        released = book.expire_holds(max_age=timedelta(seconds=seconds))
    click.echo(f"Released {released} holds older than {seconds:g} s.")


@ledger.command("refund-unserved")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    required=True,
    help="Seconds since its batch was settled after which a request still `scheduled` (no "
    "outcome recorded) counts as lost. Safe at any value while servers run; choose one above "
    "the longest a generation may take (ENGINE_MAX_SECONDS, if set), or requests still "
    "streaming are failed and refunded and their clients get 503 instead of the end of the "
    "answer.",
)
@database_option
def refund_unserved(older_than: float, database_url: str | None) -> None:
    """Refund requests that were charged but never answered (after a crash, or a failed write).

    Every request still `scheduled` for longer than --older-than seconds is marked failed and
    refunded by the per-request rule (docs/SPEC.md, "When requests fail"): its user gets back
    what the failed requests' bids added to the user's charge, never more than the charge, and
    each failed request's fee (docs/SPEC.md section 5). A request is failed only if it is still
    scheduled, and a server records an answer only if it
    is, in one conditional write each: whichever commits first wins, so a request is either
    served (its client got the whole answer, it stays charged) or failed (its client got no
    complete answer, it is refunded), never both. Safe at any time, on any replica, while
    servers run. Running it again refunds nothing more.
    """
    # Imported late: pricing a batch pulls in the auction core, which other commands never need.
    from inference_auctions.server.serving.clearing import refund_rule  # noqa: PLC0415

    with open_ledger(database_url) as book:
        refunded = book.refund_unserved(timedelta(seconds=older_than), rule=refund_rule)
    for result in refunded:
        fee = (
            f" and a request fee of {format_micros(result.fee_micros)}" if result.fee_micros else ""
        )
        click.echo(
            f"Refunded {format_micros(result.amount_micros)} credits{fee} to {result.user!r}"
            f" in batch {result.batch_id}."
        )
    click.echo(f"{len(refunded)} refunds.")


DRIFT_COLUMNS = [
    ("user", "user"),
    ("balance_micros", "balance"),
    ("expected_balance_micros", "sum of entries"),
    ("held_micros", "held"),
    ("expected_held_micros", "sum of holds"),
    ("open_holds_micros", "open holds"),
]


@ledger.command("reconcile")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@database_option
def reconcile(fmt: str, database_url: str | None) -> None:
    """Check every balance against its entries; exit 1 and name the accounts that drifted."""
    with open_ledger(database_url) as book:
        report = book.reconcile()
    record = ReconcileRecord.of(report)
    drifts = record.drifts
    if fmt == "json":
        _json(record.as_json())
    elif report.ok:
        click.echo(f"All {report.accounts_checked} accounts agree with their entries.")
    else:
        _emit_ledger_records(drifts, DriftRecord, "table", DRIFT_COLUMNS, "Accounts that drifted")
    if not report.ok:
        names = ", ".join(d.user for d in drifts)
        click.echo(
            f"Drift in {len(drifts)} of {report.accounts_checked} accounts: {names}", err=True
        )
        sys.exit(1)


@click.group()
def db() -> None:
    """Create and migrate the ledger database."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@database_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Apply the migrations up to REVISION (creates the database file for SQLite)."""
    with open_database(database_url, create=True) as url:
        upgrade_schema(url, revision)
        current = schema_revision(url)
    click.echo(f"Ledger schema at revision {current}.")


@db.command("downgrade")
@click.argument("revision")
@database_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Undo migrations down to REVISION (`base` drops every ledger table and its data)."""
    with open_database(database_url) as url:
        downgrade_schema(url, revision)
        current = schema_revision(url)
    click.echo(f"Ledger schema at revision {current or 'base'}.")


@db.command("current")
@database_option
def db_current(database_url: str | None) -> None:
    """Print the database's revision and the newest one."""
    with open_database(database_url) as url:
        current = schema_revision(url)
    click.echo(f"database: {current or 'base'}; newest: {head_revision()}")


@db.command("check")
@database_option
def db_check(database_url: str | None) -> None:
    """Exit 1 when the database schema differs from the models."""
    with open_database(database_url) as url:
        drift = schema_drift(url)
    if drift:
        for difference in drift:
            click.echo(f"drift: {describe_drift(difference)}", err=True)
        sys.exit(1)
    click.echo("The database schema matches the models.")


GROUPS = (users, budget, ledger, db)
