"""`inference-auction serve`: run the auction server."""

from __future__ import annotations

import logging
from typing import Any

import click
import uvicorn

from server.settings import ServerSettings


@click.command()
@click.option("--host", help="Interface to listen on.  [default: 127.0.0.1]")
@click.option("--port", type=int, help="Port to listen on.  [default: 8000]")
@click.option(
    "--engine-url",
    help="A real SGLang server (http://host:30000). Without it the embedded emulator serves.",
)
@click.option(
    "--engine-mode",
    type=click.Choice(["priority", "ordered"]),
    help="priority: SGLang started with --enable-priority-scheduling "
    "--schedule-low-priority-values-first; ordered: one request at a time in auction order.",
)
@click.option("--database-url", help="Ledger database.  [default: sqlite:///inference-auction.db]")
@click.option("--batch-size", type=int, help="Close a batch at this many waiting requests.")
@click.option("--max-wait-ms", type=float, help="...or this long after its oldest arrived.")
@click.option("--max-inflight", type=int, help="Close batches only while fewer are at the engine.")
@click.option("--cache-tokens", "emulator_cache_tokens", type=int, help="Emulator KV cache size.")
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
@click.option("--log-level", default="info", show_default=True)
def serve(log_level: str, **options: Any) -> None:
    """Run the auction server (FastAPI on uvicorn).

    Every option can also be set as an environment variable: INFERENCE_AUCTION_<OPTION>,
    e.g. INFERENCE_AUCTION_ENGINE_URL. The ledger schema is created or upgraded at start.
    """
    given = {key: value for key, value in options.items() if value is not None}
    settings = ServerSettings(**given)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Imported late: the app pulls in the engine and the web stack, which --help never needs.
    from server.app import create_app  # noqa: PLC0415

    click.echo(_first_steps(settings))
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level)


def _first_steps(settings: ServerSettings) -> str:
    base = f"http://{settings.host}:{settings.port}"
    default_url = ServerSettings.model_fields["database_url"].default
    db = "" if settings.database_url == default_url else f" --database-url {settings.database_url}"
    return f"""
inference-auction serving on {base}  (ledger: {settings.database_url})

First steps, in another terminal:
  1. create a user with a budget of 10 credits (prints its API key once):
       .venv/bin/inference-auction users create alice --budget 10{db}
  2. put that key in KEY (KEY=iak_...) and send a request with a bid of 0.05 credits:
       curl -s {base}/generate -H "Authorization: Bearer $KEY" \\
            -d '{{"text": "Hello, auction!", "bid": "0.05"}}'
  3. see the charge:
       curl -s {base}/v1/ledger/balance -H "Authorization: Bearer $KEY"
API docs: {base}/docs
"""
