"""The `inference-auction` command line.

Each concern registers its own command group from a module of this package; this module only
assembles them, so adding a command never touches another command's file.
"""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="inference-auctions")
def main() -> None:
    """Inference auctions: a truthful priority auction for LLM serving in front of SGLang.

    See the market at work with `inference-auction demo`, start a server with
    `inference-auction serve` (embedded engine, SQLite ledger), or clear a batch offline with
    `inference-auction auction BATCH.jsonl`.
    """


def _register() -> None:
    # Imported here so that `main` exists before the command modules attach to it.
    from inference_auctions.server.cli import (  # noqa: PLC0415
        access_commands,
        auction_command,
        cluster_command,
        demo_command,
        emulate_command,
        ledger_commands,
        serve_command,
    )

    main.add_command(auction_command.auction)
    main.add_command(serve_command.serve)
    main.add_command(demo_command.demo)
    main.add_command(emulate_command.emulate_sglang)
    main.add_command(cluster_command.cluster)
    # Its commands (the `keys` group among them) join `users` and `ledger`, added below.
    assert access_commands.keys.name == "keys"
    for group in ledger_commands.GROUPS:
        main.add_command(group)
    from inference_auctions.server.cli.experiment_command import experiment  # noqa: PLC0415  (as above)

    main.add_command(experiment)


_register()
