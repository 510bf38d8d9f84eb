"""`inference-auction serve`: run the auction server."""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

import click
import uvicorn
from pydantic import ValidationError

from inference_auctions.server.cli.first_steps import first_steps
from inference_auctions.server.log_format import configure_logging, uvicorn_log_config
from inference_auctions.server.settings import ServerSettings


@click.command()
@click.option("--host", help="Interface to listen on.  [default: 127.0.0.1]")
@click.option("--port", type=int, help="Port to listen on.  [default: 8000]")
@click.option(
    "--engine-url",
    help="A real SGLang server (http://host:30000). Without it the embedded emulator serves.",
)
@click.option(
    "--engine-ca-bundle",
    type=click.Path(exists=True, dir_okay=False),
    help="A PEM file of the certificate authorities an https:// --engine-url is checked "
    "against (default: the system's). The engine's API key is INFERENCE_AUCTION_ENGINE_API_KEY.",
)
@click.option(
    "--model-name",
    help="The model name in answers and /v1/models.  [default: the engine's served model name]",
)
@click.option(
    "--engine-mode",
    type=click.Choice(["priority", "ordered"]),
    help="priority: SGLang started with --enable-priority-scheduling "
    "--schedule-low-priority-values-first; ordered: one request at a time in auction order.",
)
@click.option(
    "--tokenizer",
    help="Who tokenizes prompts for --engine-url: 'auto' (the engine's own tokenizer and chat "
    "template, from the tokenizer_path of its /model_info when readable here; else its "
    "/tokenize), 'engine' (its /tokenize, a round trip per new prompt), 'builtin' (this "
    "project's tokenizer: the emulator's), or the path of the served model's tokenizer.json or "
    "folder (needs the 'tokenizers' extra). A local tokenizer is compared with the engine's "
    "first: a given one that differs is refused, a learnt one is not used.  [default: auto]",
)
@click.option("--database-url", help="Ledger database.  [default: sqlite:///inference-auction.db]")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    help="The most requests one batch takes; with a window, it also closes the window.  "
    "[default: 64]",
)
@click.option(
    "--max-wait-ms",
    type=click.FloatRange(min=0),
    help="Optional collection window while the engine is not saturated: a batch closes once "
    "its oldest request waited this long (or --batch-size wait). 0: a request goes to the "
    "engine at once whenever the engine can take more.  [default: 0]",
)
@click.option(
    "--scheduling",
    type=click.Choice(["rolling", "batches"]),
    help="rolling: auction the whole waiting pool at every engine opening and send the engine "
    "only what it can start at its next step; batches: the oldest --batch-size waiting "
    "requests, sent whole, whatever they bid (for comparison).  [default: rolling; batches "
    "under --pricing-rule batch-size]",
)
@click.option(
    "--free-traffic",
    type=click.Choice(["idle", "shared"]),
    help="Under --scheduling rolling: idle sends free requests (zero bids, a free tier) only "
    "while no paying request is at the engine, whose decoding their prefills would stall, and "
    "preempts one still there when a paying request comes (it resumes later from where it "
    "was); shared lets them take what the bidders leave.  [default: idle]",
)
@click.option(
    "--clearing-log",
    type=click.Path(dir_okay=False, writable=True),
    help="Under --scheduling rolling: append every clearing's pool (rids, users, bids, tree "
    "paths), head and charges to this file as JSON lines, to price them again offline.  "
    "[default: none]",
)
@click.option(
    "--price-floor",
    type=click.Choice(["off", "posted"]),
    help="Under --pricing auction --scheduling rolling: posted admits to the auction only bids "
    "at or above a floor that rises while the pool is deeper than --price-floor-target and "
    "falls while shallower (resting at 0 while the engine keeps up); the entrants sent pay it "
    "on top of their charge (docs/SPEC.md section 7). off: every positive bid enters, and "
    "pays only its charge.  [default: posted under the rolling auction]",
)
@click.option(
    "--price-floor-target",
    type=click.IntRange(min=1),
    help="The entrants in the pool the floor aims at.  [default: what the engine can start at "
    "its next step]",
)
@click.option(
    "--price-floor-start",
    type=click.IntRange(min=0),
    help="The floor's level at start, in micro-credits.  [default: 0]",
)
@click.option(
    "--dispatch-lookahead",
    type=click.IntRange(min=0),
    help="Under --scheduling rolling: requests sent beyond what the engine can start at its "
    "next step.  [default: 0]",
)
@click.option(
    "--max-inflight",
    type=click.IntRange(min=1),
    help="Hard cap on requests outstanding at the engine.  [default: 256]",
)
@click.option(
    "--saturation-tokens",
    type=click.IntRange(min=1),
    help="The engine counts as saturated, and requests wait for the next auction, while the "
    "requests sent to it without a first token hold this many prompt tokens.  [default: the "
    "engine's chunked prefill size, else 8192]",
)
@click.option(
    "--saturation-requests",
    type=click.IntRange(min=1),
    help="...or while this many requests sent to it have no first token.  [default: what the "
    "engine can start, from its running-request limit, else 32]",
)
@click.option(
    "--engine-poll-ms",
    type=click.FloatRange(min=0, min_open=True),
    help="How often the engine's waiting queue (/v1/loads) is read while requests are out.  "
    "[default: 100]",
)
@click.option(
    "--dispatch-ahead/--no-dispatch-ahead",
    default=None,
    help="Send a batch to the engine while its settlement commits, when its users could afford "
    "their bids at the last commit; answers still wait for the commit.  [default: on]",
)
@click.option("--cache-tokens", "emulator_cache_tokens", type=int, help="Emulator KV cache size.")
@click.option(
    "--emulator-max-running-requests",
    type=click.IntRange(min=1),
    help="The embedded emulator's cap on running requests, as SGLang's --max-running-requests."
    "  [default: none]",
)
@click.option(
    "--time-scale",
    "emulator_time_scale",
    type=float,
    help="Emulator wall-clock seconds per model second (0.01 runs 100x faster).",
)
@click.option(
    "--deferral/--no-deferral",
    default=None,
    help="Hold back a request while an earlier one of its batch computes their shared prefix "
    "(priority mode).  [default: on]",
)
@click.option(
    "--deferral-tokens",
    type=click.IntRange(min=1),
    help="Shared uncached prompt tokens that make a request wait.  [default: 32]",
)
@click.option(
    "--deferral-max-hold-ms",
    type=click.FloatRange(min=0),
    help="The longest a request is held back.  [default: 60000]",
)
@click.option(
    "--priority-slots",
    type=click.IntRange(min=1),
    help="Priority slots every batch is priced in, the same on every replica; at least the "
    "batch size (docs/SPEC.md section 5).  [default: the batch size]",
)
@click.option(
    "--pricing-rule",
    type=click.Choice(["fixed-slots", "batch-size"]),
    help="fixed-slots, or the paper's batch-size slots (open to price dilution).  "
    "[default: fixed-slots]",
)
@click.option(
    "--request-fee-micros",
    type=click.IntRange(min=0),
    help="The fee every request pays besides its VCG charge, zero bids included, in "
    "micro-credits; the same on every replica (docs/SPEC.md section 5).  [default: 0]",
)
@click.option(
    "--pricing",
    type=click.Choice(["auction", "tiers", "fcfs"]),
    help="How priority is sold: auction (bids, VCG charges), tiers (fixed prices per request, "
    "--tiers) or fcfs (first come, first served: bids ignored, nothing charged); the same on "
    "every replica of a ledger.  [default: auction]",
)
@click.option(
    "--tiers",
    help="The tiers sold under --pricing tiers: name=price pairs, price in credits per "
    "request, each price different (a dearer tier is served first).  "
    "[default: flex=0,default=0.0005,priority=0.005]",
)
@click.option(
    "--default-tier",
    help="The tier of a request that names none (or 'auto').  [default: the cheapest]",
)
# Removed: the ledger's group commits run on threads of the server. Still parsed, so that
# `--ledger-writer process` is refused by name rather than as an unknown option.
@click.option("--ledger-writer", hidden=True)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as text, or as JSON objects with the request id, user and batch of the "
    "request each belongs to.  [default: text]",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"], case_sensitive=False),
    default="warning",
    show_default=True,
    help="What the server logs: info adds its start-up, the migrations and every request.",
)
def serve(log_level: str, **options: Any) -> None:
    """Run the auction server (FastAPI on uvicorn).

    Every option can also be set as an environment variable: INFERENCE_AUCTION_<OPTION>,
    e.g. INFERENCE_AUCTION_ENGINE_URL. The ledger schema is created or upgraded at start.
    """
    if options.get("ledger_writer") not in (None, "thread"):
        raise click.UsageError(
            f"--ledger-writer {options['ledger_writer']}: the process ledger writer was "
            "removed; the ledger's group commits run on threads of the server (drop the option)"
        )
    given = {key: value for key, value in options.items() if value is not None}
    try:
        settings = ServerSettings(**given)
    except ValidationError as error:  # a setting that fits no other (priority_slots) or the env
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'settings'}: {e['msg']}"
            for e in error.errors()
        )
        raise click.UsageError(problems) from None
    if settings.engine_url is not None:
        _check_tokenizer(settings.tokenizer)
    _check_database(settings.database_url, given="database_url" in given)
    configure_logging(log_level, settings.log_format)
    listener = _listen(settings.host, settings.port)  # a busy port fails before the banner
    # Imported late: the app pulls in the engine and the web stack, which --help never needs.
    from inference_auctions.server.api.connections import uvicorn_config  # noqa: PLC0415
    from inference_auctions.server.app import create_app  # noqa: PLC0415
    from inference_auctions.server.start_refusal import QuietStartupFailure  # noqa: PLC0415

    click.echo(first_steps(settings))
    app = create_app(settings)
    uvicorn_logs = uvicorn_log_config(settings.log_format)
    logs = {} if uvicorn_logs is None else {"log_config": uvicorn_logs}
    config = uvicorn_config(app, settings, log_level=log_level, **logs)
    # A refusal at start is its one line in the log (the app's), and nothing after it.
    quiet = QuietStartupFailure(lambda: bool(app.state.start_refused))
    logging.getLogger("uvicorn.error").addFilter(quiet)
    uvicorn.Server(config).run(sockets=[listener])


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or a usage error that says how to choose another port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise click.ClickException(
                f"port {port} on {host} is already in use (another inference-auction serve?); "
                "choose another with --port or INFERENCE_AUCTION_PORT"
            ) from None
        raise click.ClickException(f"cannot listen on {host}:{port}: {error.strerror}") from None


def _check_database(url: str, *, given: bool) -> None:
    """Exit 2 with one line, before the banner, when the ledger's database cannot be used."""
    # Imported late, like the app: --help never needs it.
    from inference_auctions.billing import (  # noqa: PLC0415
        InvalidInput,
        LedgerUnavailable,
        mask_database_url,
        probe_database,
    )
    from inference_auctions.server.cli.ledger_commands import DatabaseProblem  # noqa: PLC0415

    name = "--database-url" if given else "INFERENCE_AUCTION_DATABASE_URL"
    try:
        probe_database(url)
    except InvalidInput as error:
        raise DatabaseProblem(f"{name}: {error.problem}") from None
    except LedgerUnavailable as error:
        raise DatabaseProblem(
            f"cannot reach the ledger's database at {mask_database_url(url)} ({error.cause}); "
            f"check that it is running and reachable, or give another with {name}"
        ) from None


def _check_tokenizer(setting: str) -> None:
    """A usage error, before the banner, for a --tokenizer that cannot be loaded."""
    # Imported late, like the app: --help never needs it.
    from inference_auctions.server.engine.local_tokenizer import (  # noqa: PLC0415
        TokenizerSetupError,
        check_tokenizer_setting,
    )

    try:
        check_tokenizer_setting(setting)
    except TokenizerSetupError as error:
        raise click.ClickException(str(error)) from None
