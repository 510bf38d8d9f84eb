"""`inference-auction demo`: the market in a minute, on a real server.

It starts `inference-auction serve` on a free port (embedded engine, a SQLite ledger in a
temporary folder), creates four users with daily budgets, sends one request of each at the
same moment through the SDK, and prints the batch they met in: who went first, who paid what,
and each charge as the delay that user's bid imposes on the others. The server then stays up
for the dashboard until Ctrl-C.

Batching is work-conserving: on an idle engine a request that arrives alone goes out alone,
and pays nothing. So that the four requests always meet, the demo's server collects each batch
until `--batch-size` (4) requests wait or the first has waited `--max-wait-ms` (2000), both
documented `serve` options; a plain `serve` closes a batch at once while the engine has room.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import click
import httpx

from inference_auctions.billing import (
    Ledger,
    format_micros,
    parse_credits,
    upgrade_schema,
)
from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.cli.demo_story import UserStory, explain
from inference_auctions.server.engine.builtin_tokenizer import encode

ARTICLE = (
    "Article: The Amazon rainforest covers much of the Amazon basin of South America, about "
    "seven million square kilometres, of which five and a half million are forest. The region "
    "spans nine nations; Brazil holds sixty percent of it, followed by Peru and Colombia. "
)


@dataclass(frozen=True)
class DemoUser:
    """A user of the demo: what one answer is worth to it, and what it asks."""

    name: str
    value: str  # credits: what full priority for this request is worth to the user
    prompt: str


USERS = [
    DemoUser("alice", "0.60", ARTICLE + "Question: How large is the basin?"),
    DemoUser("bob", "0.10", ARTICLE + "Question: Which countries share it?"),
    DemoUser("carol", "0.90", "Translate to French: see you soon."),
    DemoUser("dave", "0.25", "Write a haiku about snow."),
]
DAILY_BUDGET = "5"
MAX_WAIT_MS = 2000
MAX_NEW_TOKENS = 16


@dataclass(frozen=True)
class Served:
    """One user's request as the server answered it."""

    user: DemoUser
    api_key: str
    rid: str
    batch_id: str
    position: int
    batch_size: int
    bid_micros: int
    request_charge_micros: int
    user_batch_charge_micros: int
    balance_before_micros: int
    balance_after_micros: int
    text: str


@click.command()
@click.option("--port", type=int, default=None, help="Port to serve on.  [default: a free one]")
@click.option(
    "--exit",
    "exit_after",
    is_flag=True,
    help="Stop the server once the batch is shown, rather than keep it up for the dashboard.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the batch as JSON (implies --exit).")
def demo(port: int | None, exit_after: bool, as_json: bool) -> None:
    """Show the auction at work: four users bid for one batch on a real server.

    Starts `serve` (embedded engine, a temporary SQLite ledger), creates alice, bob, carol and
    dave with a daily budget of 5 credits each, sends their requests at the same moment through
    the SDK, and prints who went first, who paid what and why. The server stays up, with the
    dashboard, until Ctrl-C; its ledger is deleted then.
    """
    try:
        from inference_auctions.sdk import AuctionClient  # noqa: PLC0415, F401
    except ImportError:
        raise click.ClickException(
            "the demo sends its requests through the SDK, which is not installed: "
            "pip install ./sdk (or `make run`, which installs both)"
        ) from None
    _stop_on_termination()
    with tempfile.TemporaryDirectory(prefix="inference-auction-demo-") as folder:
        database_url = f"sqlite:///{Path(folder) / 'ledger.db'}"
        keys, admin_key = _create_users(database_url)
        port = port or _free_port()
        log = Path(folder) / "server.log"
        with _server(database_url, port, log) as base_url:
            served = _send_at_once(base_url, keys)
            if as_json:
                click.echo(json.dumps(_as_json(base_url, served), indent=2))
                return
            _print_batch(base_url, served)
            _print_dashboard(base_url, admin_key, served, stay=not exit_after)
            if not exit_after:
                _wait_for_interrupt()


def _create_users(database_url: str) -> tuple[dict[str, str], str]:
    upgrade_schema(database_url)
    budget = parse_credits(DAILY_BUDGET, "budget")
    with Ledger.from_url(database_url) as ledger:
        keys = {
            user.name: ledger.create_user(user.name, budget_micros=budget, period="day").api_key
            for user in USERS
        }
        admin = ledger.create_user("operator", budget_micros=0, admin=True).api_key
    return keys, admin


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def _server(database_url: str, port: int, log: Path) -> Iterator[str]:
    """`inference-auction serve` for the demo; yields its URL once healthy, stops it after."""
    # The demo's settings alone, whatever INFERENCE_AUCTION_* the shell exports.
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_AUCTION_")}
    command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
    command += ["--port", str(port), "--database-url", database_url, "--log-level", "warning"]
    command += ["--batch-size", str(len(USERS)), "--max-wait-ms", str(MAX_WAIT_MS)]
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=output)
    try:
        _wait_until_healthy(url, process, log)
        yield url
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise click.ClickException(f"the demo's server stopped:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise click.ClickException(f"the demo's server did not answer at {url} within 60 s")


def _send_at_once(base_url: str, keys: dict[str, str]) -> list[Served]:
    """Each user's request, all sent at one moment from threads of their own."""
    from inference_auctions.sdk import AuctionClient  # noqa: PLC0415  (checked by `demo`)

    clients = {user.name: AuctionClient(base_url, keys[user.name], timeout=60) for user in USERS}
    before = {}
    for user in USERS:
        clients[user.name].sync()  # read the budget period now, not after the start signal
        before[user.name] = clients[user.name].ledger.balance().balance_micros
    start = threading.Barrier(len(USERS))
    answers: dict[str, Any] = {}

    def ask(user: DemoUser) -> None:
        start.wait()
        try:
            answers[user.name] = clients[user.name].generate(
                user.prompt, value=user.value, max_new_tokens=MAX_NEW_TOKENS
            )
        except Exception as error:  # shown below, with the user's name
            answers[user.name] = error

    threads = [threading.Thread(target=ask, args=(user,)) for user in USERS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    served = []
    for user in USERS:
        answer = answers[user.name]
        if isinstance(answer, Exception):
            raise click.ClickException(f"{user.name}'s request failed: {answer}")
        client = clients[user.name]
        served.append(
            Served(
                user=user,
                api_key=keys[user.name],
                rid=answer.rid,
                batch_id=answer.auction.batch_id,
                position=answer.auction.position,
                batch_size=answer.auction.batch_size,
                bid_micros=answer.auction.bid_micros,
                request_charge_micros=answer.auction.request_charge_micros,
                user_batch_charge_micros=answer.auction.user_batch_charge_micros,
                balance_before_micros=before[user.name],
                balance_after_micros=client.ledger.balance().balance_micros,
                text=answer.text,
            )
        )
        client.close()
    return sorted(served, key=lambda s: (s.batch_id, s.position))


def _stories(served: list[Served]) -> list[UserStory]:
    """The batch cleared again offline, from the same prompts and bids: why each user pays."""
    requests = [
        AuctionRequest(
            rid=s.user.name, user=s.user.name, tokens=encode(s.user.prompt), bid=s.bid_micros
        )
        for s in sorted(served, key=lambda s: s.position)
    ]
    return explain(requests, run_auction(requests))


def _one_batch(served: list[Served]) -> bool:
    return len({s.batch_id for s in served}) == 1


def _print_batch(base_url: str, served: list[Served]) -> None:
    n = served[0].batch_size
    click.echo(
        f"\nFour users sent a request at the same moment to a real server at {base_url}\n"
        f"(embedded engine, a temporary SQLite ledger). Each bid what priority is worth to it."
    )
    if not _one_batch(served):
        click.echo("\nThey did not meet in one batch this time; each batch was auctioned alone:")
    click.echo(f"\nBatch of {n}, as the auction ordered it (position 0 is served first):\n")
    click.echo(f"  {'pos':>3}  {'user':<6} {'bid':>9}  {'charged':>9}  {'budget left':>11}  prompt")
    for s in served:
        prompt = s.user.prompt
        if prompt.startswith(ARTICLE):
            prompt = "[article] " + prompt.removeprefix(ARTICLE + "Question: ")
        click.echo(
            f"  {s.position:>3}  {s.user.name:<6} {format_micros(s.bid_micros):>9}  "
            f"{format_micros(s.request_charge_micros):>9}  "
            f"{format_micros(s.balance_after_micros):>11}  {_cut(prompt, 36)}"
        )
    click.echo(
        "\n  bid: the SDK bids the user's value (fresh budget, nothing to pace yet); charged: the"
        "\n  request's `request_charge_micros`, taken from the user's daily budget of"
        f" {DAILY_BUDGET} credits."
    )
    if not _one_batch(served):
        return
    positions = {s.user.name: s.position for s in served}
    if positions["alice"] < positions["bob"] < positions["dave"]:
        click.echo(
            "\nWhy this order: requests that share a prompt prefix are served together, so the"
            "\nengine computes the prefix once; groups go by their average bid. alice and bob ask"
            "\nabout the same article (average bid 0.35), so bob (0.10) is served before dave"
            " (0.25)."
        )
    click.echo(
        "\nWhy these charges: each user pays the delay its bid imposes on the others (VCG). Set"
        "\na user's bid to 0 and clear the batch again: every request that then moves up was"
        f"\npushed down by that bid, and each place is worth 1/{n - 1} of the pushed request's bid"
        "\n(each term rounded down to a micro-credit here; the charge rounds their exact sum):\n"
    )
    order = {s.user.name: s.position for s in served}
    for story in sorted(_stories(served), key=lambda story: order[story.user]):
        for line in _reasons(story, n):
            click.echo(line)
    click.echo("\n  Nobody pays more than their bid; a bid that moves nobody costs nothing.")


def _reasons(story: UserStory, n: int) -> list[str]:
    head = f"  {story.user:<6} pays {format_micros(story.charge_micros)}"
    if not story.delays:
        return [f"{head}: without {story.user}'s bid, everyone else keeps their place"]
    lines = []
    for index, delay in enumerate(story.delays):
        places = "place " if abs(delay.places) == 1 else "places"
        moved = "down" if delay.places > 0 else "up"
        lead = f"{head} =" if index == 0 else " " * len(head) + " +"
        lines.append(
            f"{lead} {delay.user:<6} {abs(delay.places)} {places} {moved}"
            f" x bid {format_micros(delay.bid_micros)} / {n - 1}"
            f" = {_credits(delay.cost)}"
        )
    return lines


def _credits(amount_micros: Fraction) -> str:
    # Rounded down to whole micro-credits, as the charges are.
    return format_micros(amount_micros.numerator // amount_micros.denominator)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _print_dashboard(base_url: str, admin_key: str, served: list[Served], *, stay: bool) -> None:
    if not stay:
        return
    first = served[0]
    click.echo(
        f"\nSee it on the dashboard: {base_url}/dashboard, signed in with"
        f"\n  the operator's key {admin_key}  (the whole market: batches, prices, revenue)"
        f"\n  {first.user.name}'s key {first.api_key}  (a user's balance, spend and requests)"
        "\nSend more yourself (a batch closes when 4 requests wait, or 2 s after the first):"
        f"\n  curl -s {base_url}/generate -H 'Authorization: Bearer {first.api_key}' \\"
        """\n       -d '{"text": "Hello, auction!", "bid": "0.05"}'"""
        "\nCtrl-C stops the server and deletes the demo's ledger."
    )


def _stop_on_termination() -> None:
    """Make SIGTERM and SIGHUP stop the demo as Ctrl-C does: the default action would end
    this process at once and leave its server running, orphaned, with the ledger's folder."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)


def _wait_for_interrupt() -> None:
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        click.echo("\nStopped; the demo's ledger is deleted.")


def _as_json(base_url: str, served: list[Served]) -> dict[str, Any]:
    stories = _stories(served) if _one_batch(served) else []
    return {
        "server": base_url,
        "requests": [
            {
                "user": s.user.name,
                "rid": s.rid,
                "batch_id": s.batch_id,
                "position": s.position,
                "batch_size": s.batch_size,
                "value_micros": parse_credits(s.user.value, "value"),
                "bid_micros": s.bid_micros,
                "request_charge_micros": s.request_charge_micros,
                "user_batch_charge_micros": s.user_batch_charge_micros,
                "balance_before_micros": s.balance_before_micros,
                "balance_after_micros": s.balance_after_micros,
            }
            for s in served
        ],
        "charges": [
            {
                "user": story.user,
                "charge_micros": story.charge_micros,
                "externality": str(story.externality),  # exact, as a fraction of micros
                "delays": [
                    {
                        "user": delay.user,
                        "bid_micros": delay.bid_micros,
                        "position": delay.position,
                        "position_without": delay.position_without,
                        "cost": str(delay.cost),
                    }
                    for delay in story.delays
                ],
            }
            for story in stories
        ],
    }
