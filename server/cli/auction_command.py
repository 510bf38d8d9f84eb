"""`inference-auction auction BATCH.jsonl`: clear one batch offline and print the outcome."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

import click
from rich.table import Table

from inference_auctions.billing import InvalidAmount, format_micros, parse_credits
from inference_auctions.server.auction import (
    AuctionInputError,
    AuctionOutcome,
    AuctionRequest,
    run_auction,
)
from inference_auctions.server.auction.charges import PricingRule
from inference_auctions.server.cli.console import table_console
from inference_auctions.server.cli.jsonlines import (
    RecordError,
    read_records,
    record_credits,
    record_tokens,
)


class BatchFileError(click.ClickException):
    """A line of the batch file is malformed; the message names the line and the field."""

    exit_code = 2


@click.command()
@click.argument("batch", type=click.File("r", encoding="utf-8"))
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON for machines.")
@click.option(
    "--slots",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Priority slots K every delay is priced in (the server's priority_slots, by default"
    " its batch_size); a batch may not hold more requests.",
)
@click.option(
    "--batch-size-slots",
    is_flag=True,
    help="Price in the batch's own size instead (the paper's rule, pricing_rule=batch-size).",
)
@click.option(
    "--fee",
    default="0",
    show_default=True,
    help="The request fee in credits: what every request pays besides its VCG charge.",
)
def auction(batch: TextIO, as_json: bool, slots: int, batch_size_slots: bool, fee: str) -> None:
    """Clear one batch of requests and print the schedule and the VCG payments.

    BATCH is a JSON-lines file (`-` reads standard input), one request per line:

    \b
      {"rid": "r1", "user": "alice", "prompt": "Summarize ...", "bid": "0.25"}
      {"rid": "r2", "user": "bob", "tokens": [101, 7, 42], "bid": 1.5}

    `bid` is in credits (a JSON number or a decimal string, at most 6 decimals); money is
    printed in credits with 6 decimals and, with --json, as integer `*_micros` fields. Text
    prompts go through the default tokenizer (see `server/engine/builtin_tokenizer.py`; no
    download), so prompts that share a text prefix share a token prefix.
    """
    try:
        fee_micros = parse_credits(fee, "fee")
    except InvalidAmount as error:
        raise click.BadParameter(str(error), param_hint="--fee") from None
    rule = PricingRule(slots=None if batch_size_slots else slots, request_fee_micros=fee_micros)
    requests = read_batch(batch, Path(batch.name).name)
    try:
        outcome = run_auction(requests, rule)
    except AuctionInputError as error:
        raise BatchFileError(str(error)) from None
    if as_json:
        click.echo(json.dumps(outcome_json(outcome), indent=2))
    else:
        print_outcome(outcome)


def read_batch(lines: TextIO, name: str) -> list[AuctionRequest]:
    """Parse the JSON lines of a batch file into auction requests (blank lines are skipped)."""
    try:
        return [_request(record, where) for where, record in read_records(lines, name)]
    except RecordError as error:
        raise BatchFileError(str(error)) from None


def _request(record: dict[str, Any], where: str) -> AuctionRequest:
    user = record.get("user")
    if not isinstance(user, str) or not user:
        raise RecordError(f"{where}: field 'user' must be a non-empty string")
    tokens = record_tokens(record, where)
    bid = record_credits(record, "bid", where)
    if bid is None:
        raise RecordError(f"{where}: field 'bid' is missing (credits, e.g. \"0.25\")")
    rid = record.get("rid", "line-" + where.rpartition(":")[2])
    return AuctionRequest(rid=str(rid), user=user, tokens=tokens, bid=bid)


def outcome_json(outcome: AuctionOutcome) -> dict[str, Any]:
    """The outcome with money as integer micro-credits."""
    return {
        "order": outcome.order,
        "requests": [
            {
                "rid": rid,
                "user": outcome.users[rid],
                "position": outcome.positions[rid],
                "priority": float(outcome.priority(rid)),
                "bid_micros": outcome.bids[rid],
            }
            for rid in outcome.order
        ],
        "rule": {
            "name": outcome.rule.name,
            "slots": outcome.slots,
            "request_fee_micros": outcome.rule.request_fee_micros,
        },
        "payments_micros": outcome.payments,
        "fees_micros": outcome.fees,
        "charges_micros": {user: outcome.charge(user) for user in outcome.payments},
        "revenue_micros": outcome.revenue,
        "fee_revenue_micros": outcome.fee_revenue,
        "welfare_micros": int(outcome.welfare),  # rounded down, like the payments
        "tree": {
            "requests": outcome.tree.requests,
            "nodes": outcome.tree.nodes,
            "depth": outcome.tree.depth,
            "total_tokens": outcome.tree.total_tokens,
            "unique_tokens": outcome.tree.unique_tokens,
            "shared_tokens": outcome.tree.shared_tokens,
        },
    }


def print_outcome(outcome: AuctionOutcome) -> None:
    """Print the schedule and the payments as tables."""
    console = table_console()
    schedule = Table(title=f"Schedule ({outcome.size} requests, first served first)")
    for column in ("position", "rid", "user", "bid", "priority"):
        schedule.add_column(column, justify="left" if column in ("rid", "user") else "right")
    for rid in outcome.order:
        schedule.add_row(
            str(outcome.positions[rid]),
            rid,
            outcome.users[rid],
            format_micros(outcome.bids[rid]),
            f"{float(outcome.priority(rid)):.4f}",
        )
    console.print(schedule)
    console.print(
        "Requests that share a prompt prefix are served together (the cache reuses the prefix); "
        "subtrees go in order of their average bid, so a high bid in a low-bidding group can "
        "be served after a lone lower bid."
    )

    rule = outcome.rule
    payments = Table(
        title=f"VCG payments and fees (credits; {outcome.slots} priority slots,"
        f" fee {format_micros(rule.request_fee_micros)} a request)"
    )
    for column in ("user", "requests", "value", "payment", "fees", "charge"):
        payments.add_column(column, justify="left" if column == "user" else "right")
    for user, payment in sorted(outcome.payments.items()):
        rids = [rid for rid in outcome.order if outcome.users[rid] == user]
        value = sum(outcome.bids[rid] * outcome.priority(rid) for rid in rids)
        payments.add_row(
            user,
            str(len(rids)),
            format_micros(int(value)),
            format_micros(payment),
            format_micros(outcome.fees[user]),
            format_micros(outcome.charge(user)),
        )
    console.print(payments)
    stats = outcome.tree
    console.print(
        f"welfare {format_micros(int(outcome.welfare))}  revenue {format_micros(outcome.revenue)}"
        f" + fees {format_micros(outcome.fee_revenue)}"
        f"  tree: {stats.nodes} nodes, depth {stats.depth}, {stats.shared_tokens:,} of "
        f"{stats.total_tokens:,} prompt tokens shared"
    )
