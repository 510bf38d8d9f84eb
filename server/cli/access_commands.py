"""`inference-auction users keys|limits|actions` and `ledger grant`: a user's API keys, its rate
limits, the record of administrative actions, and an extra grant. The HTTP admin API makes
the same ledger calls (`server.api.admin_access_routes`, `admin_money_routes`)."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from inference_auctions.billing import format_micros
from inference_auctions.server.cli.ledger_commands import (
    TABLE_FORMATS,
    _emit,
    _json,
    _moment,
    _record,
    cli_actor,
    database_option,
    ledger,
    open_ledger,
    users,
)
from inference_auctions.server.cli.ledger_commands import _credits as credits_option

KEY_COLUMNS = [
    ("name", "key"),
    ("prefix", "prefix"),
    ("created_at", "created"),
    ("expires_at", "expires"),
    ("revoked_at", "revoked"),
]
ACTION_COLUMNS = [
    ("id", "id"),
    ("at", "at"),
    ("actor", "by"),
    ("action", "action"),
    ("user", "user"),
    ("details", "details"),
]


@users.group("keys")
def keys() -> None:
    """List, create and revoke a user's named API keys."""


@keys.command("list")
@click.argument("name")
@click.option("--revoked", is_flag=True, help="Show the revoked keys too.")
@click.option("--format", "fmt", type=TABLE_FORMATS, default="table", show_default=True)
@database_option
def list_keys(name: str, revoked: bool, fmt: str, database_url: str | None) -> None:
    """List NAME's API keys (their prefixes, never the keys)."""
    with open_ledger(database_url) as book:
        _emit(book.api_keys(name, revoked=revoked), fmt, KEY_COLUMNS, f"API keys of {name}")


@keys.command("create")
@click.argument("name")
@click.argument("key_name")
@click.option(
    "--expires",
    callback=_moment,
    default=None,
    metavar="TIME",
    help="When the key stops working, ISO 8601 (UTC unless an offset is given).",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@database_option
def create_key(
    name: str, key_name: str, expires: datetime | None, fmt: str, database_url: str | None
) -> None:
    """Give NAME another API key called KEY_NAME, printed only this once."""
    with open_ledger(database_url) as book:
        issued = book.create_api_key(name, key_name, expires_at=expires, actor=cli_actor())
    if fmt == "json":
        _json({**_record(issued.key), "api_key": issued.api_key})
        return
    until = "until revoked" if expires is None else f"until {expires.isoformat()}"
    click.echo(f"API key {key_name!r} of {name!r}, valid {until} (shown only now):")
    click.echo(issued.api_key)


@keys.command("revoke")
@click.argument("name")
@click.argument("key_name")
@database_option
def revoke_key(name: str, key_name: str, database_url: str | None) -> None:
    """Revoke NAME's API key called KEY_NAME."""
    with open_ledger(database_url) as book:
        book.revoke_api_key(name, key_name, actor=cli_actor())
    click.echo(f"Revoked API key {key_name!r} of {name!r}. Running servers apply this within 2 s.")


def _limit(ctx: click.Context, param: click.Parameter, value: str | None) -> str | int | None:
    # Absent (None) leaves the limit as it is; "none" removes it.
    if value is None or value.lower() == "none":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number or 'none'", ctx, param) from None


@users.command("limits")
@click.argument("name")
@click.option(
    "--rpm", callback=_limit, metavar="N|none", help="Requests per minute ('none': no limit)."
)
@click.option(
    "--tpm", callback=_limit, metavar="N|none", help="Tokens per minute ('none': no limit)."
)
@database_option
def set_limits(
    name: str, rpm: str | int | None, tpm: str | int | None, database_url: str | None
) -> None:
    """Set NAME's own requests-per-minute and tokens-per-minute limits (without an option:
    show them)."""
    given: dict[str, int | None] = {
        field: value if isinstance(value, int) else None
        for field, value in (("requests_per_minute", rpm), ("tokens_per_minute", tpm))
        if value is not None
    }
    with open_ledger(database_url) as book:
        if given:
            info = book.set_rate_limits(name, **given, actor=cli_actor())
        else:
            info = book.get_user(name)

    def show(value: int | None) -> str:
        return "no limit" if value is None else f"{value:,}"

    click.echo(
        f"Limits of {name!r}: {show(info.requests_per_minute)} requests per minute,"
        f" {show(info.tokens_per_minute)} tokens per minute."
        + (" Running servers apply this within 2 s." if given else "")
    )


@users.command("actions")
@click.option("--user", "user", default=None, help="Only the actions on this user.")
@click.option("--after", default=0, show_default=True, help="Only actions after this id.")
@click.option("--limit", default=100, show_default=True, help="At most this many.")
@click.option("--format", "fmt", type=TABLE_FORMATS, default="table", show_default=True)
@database_option
def list_actions(
    user: str | None, after: int, limit: int, fmt: str, database_url: str | None
) -> None:
    """List recorded administrative actions, who made them and with what, oldest first."""
    with open_ledger(database_url) as book:
        actions = book.admin_actions(user=user, after_id=after, limit=limit)
    _emit(actions, fmt, ACTION_COLUMNS, "Administrative actions")


@ledger.command("grant")
@click.argument("name")
@click.argument("amount", callback=credits_option, metavar="CREDITS")
@click.option("--reason", default=None, help="Why: kept in the entry.")
@database_option
def grant(name: str, amount: int, reason: str | None, database_url: str | None) -> None:
    """Grant NAME CREDITS more for the current period (once per period: a repeat with
    the same amount changes nothing)."""
    started = datetime.now(UTC)
    with open_ledger(database_url) as book:
        entry = book.grant(name, started, amount, reason=reason, actor=cli_actor())
    if entry.created_at < started:
        click.echo(
            f"Already granted {format_micros(entry.amount_micros)} credits this period"
            f" (entry {entry.id}): nothing changed."
        )
        return
    click.echo(
        f"Granted {name!r} {format_micros(entry.amount_micros)} more credits (entry {entry.id})."
    )
