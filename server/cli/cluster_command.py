"""`inference-auction cluster`: several auction servers behind SMG on one ledger, on this machine.

Each auction server fronts one SGLang worker (emulated here unless `--engine-url` names real
ones) and clears its own batches; SMG routes by prefix and load, never by bid; every server
writes to the one database. docs/SCALE-OUT.md explains the deployment.
"""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path
from types import FrameType

import click

from inference_auctions.server.settings import ServerSettings, without_password

_DEFAULT_DB = ServerSettings.model_fields["database_url"].default


class _Stop(Exception):
    """SIGINT (Ctrl-C) or SIGTERM arrived: stop the deployment."""


class _StopOnce:
    """A signal handler that raises `_Stop` the first time only: a second Ctrl-C must not
    interrupt the stopping of the children half-way."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        if not self.raised:
            self.raised = True
            raise _Stop


@click.command()
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=64),
    help="How many emulated SGLang workers (each with its own auction server).  [default: 2]",
)
@click.option(
    "--engine-url",
    "engine_urls",
    multiple=True,
    help="A real SGLang worker; give it once per worker (then no emulator starts).",
)
@click.option(
    "--database-url",
    default=_DEFAULT_DB,
    show_default=True,
    help="The ledger every auction server shares; PostgreSQL for more than one machine.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface of every process.")
@click.option("--port", default=8000, show_default=True, help="SMG's port: where clients connect.")
@click.option(
    "--policy",
    default="cache_aware",
    show_default=True,
    type=click.Choice(["cache_aware", "round_robin", "power_of_two", "random"]),
    help="SMG's routing policy. Each is blind to bids, which keeps every auction truthful.",
)
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Emulated workers' wall-clock seconds per model second.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where each process writes its log.  [default: a new temporary directory]",
)
def cluster(
    workers: int | None,
    engine_urls: tuple[str, ...],
    database_url: str,
    host: str,
    port: int,
    policy: str,
    time_scale: float,
    log_dir: Path | None,
) -> None:
    """Run N auction servers, one per SGLang worker, behind SMG, on one ledger; Ctrl-C stops all.

    Without --engine-url, --workers N emulated SGLang workers start too (no GPU needed). With
    --engine-url given once per worker, the auction servers front those workers instead.
    SMG (`pip install smg`) must be installed. Every auction server uses --database-url; on
    SQLite they are one machine's processes sharing one file, so use PostgreSQL to go further.
    """
    # Imported late: --help should not load the web stack.
    from inference_auctions.server.cluster.smg import SMGMissing, find_smg  # noqa: PLC0415
    from inference_auctions.server.cluster.supervisor import ClusterPlan, run_cluster  # noqa: PLC0415

    if engine_urls and workers is not None and workers != len(engine_urls):
        raise click.UsageError(
            f"--workers {workers} but {len(engine_urls)} --engine-url: give one URL per worker"
        )
    try:
        find_smg()
    except SMGMissing as error:
        raise click.ClickException(str(error)) from None
    count = len(engine_urls) or workers or 2
    logs = log_dir or Path(tempfile.mkdtemp(prefix="inference-auction-cluster-"))
    plan = ClusterPlan(
        workers=count,
        database_url=database_url,
        log_dir=logs,
        host=host,
        port=port,
        engine_urls=engine_urls,
        time_scale=time_scale,
        policy=policy,
    )
    what = "SGLang workers" if engine_urls else "emulated SGLang workers (no model runs)"
    click.echo(f"Starting {count} auction servers for {count} {what}, SMG in front; logs: {logs}")
    # SIGINT too: a shell that starts the command in the background ignores SIGINT for it,
    # and Python then never raises KeyboardInterrupt.
    handler = _StopOnce()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with run_cluster(plan) as running:
            targets = engine_urls or tuple(engine.url for engine in running.engines)
            for replica, target in zip(running.replicas, targets, strict=True):
                click.echo(f"  {replica.name}: {replica.url} -> {target}")
            click.echo(
                f"SMG ({policy}) on {running.url}; ledger {without_password(database_url)}\n"
                f"Send requests there, e.g. curl -s {running.url}/generate "
                '-H "Authorization: Bearer $KEY" -H "Content-Type: application/json" '
                '-d \'{"text": "Hello", "bid": "0.05"}\'\n'
                "Ctrl-C stops everything."
            )
            while not (dead := running.dead()):
                time.sleep(0.5)
            names = ", ".join(f"{c.name} (exit {c.process.returncode})" for c in dead)
            raise click.ClickException(f"{names} stopped; see its log in {logs}. Stopping all.")
    except (KeyboardInterrupt, _Stop):
        click.echo("Stopped SMG, then the auction servers (drained), then the workers.")
    except RuntimeError as error:
        raise click.ClickException(str(error)) from None
    finally:
        for sig, earlier in previous.items():
            signal.signal(sig, earlier)
